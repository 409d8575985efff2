"""LanguagePolicy: sampled batches, and log-probs recomputed exactly as they were sampled.

A real tiny Qwen2 (hidden 32) samples every batch; the reference log-probs come from the
scores ``generate`` itself used at sampling time (spied with ``output_scores``).
"""

import dataclasses
import types

import pytest
import torch

from creditflow.algorithms import topp_entropy
from creditflow.rollout import LanguagePolicy, RolloutBatch, SamplingSettings


def _spy_generate(model) -> dict:
    """Make ``model.generate`` also keep the processed per-step scores it sampled from."""
    generate, seen = model.generate, {}

    def spying_generate(**kwargs):
        out = generate(**kwargs, output_scores=True, return_dict_in_generate=True)
        seen["scores"] = torch.stack(out.scores, dim=1)  # (B, T, V)
        return out.sequences

    model.generate = spying_generate
    return seen


def _alone(batch: RolloutBatch, row: int) -> RolloutBatch:
    """Row ``row`` as a batch of one, stripped of the padding other rows forced on it."""
    keep_p = batch.prompt_mask[row].bool()
    n_valid = int(batch.completion_mask[row].sum())
    one = batch.select(torch.tensor([row]))
    return dataclasses.replace(
        one,
        prompt_ids=one.prompt_ids[:, keep_p],
        prompt_mask=one.prompt_mask[:, keep_p],
        completion_ids=one.completion_ids[:, :n_valid],
        completion_mask=one.completion_mask[:, :n_valid],
        old_logp=one.old_logp[:, :n_valid],
    )


def test_sample_groups_rows_and_pads_after_eos(make_model, tapo_tokenizer, tapo_prompts):
    policy = LanguagePolicy(make_model(), tapo_tokenizer, SamplingSettings(max_new_tokens=10))
    torch.manual_seed(0)
    batch = policy.sample(tapo_prompts[:3], group_size=2, with_entropy=True)
    B, T = batch.completion_ids.shape
    assert B == 6 and T <= 10
    assert batch.group_size == 2
    torch.testing.assert_close(batch.prompt_index, torch.tensor([0, 0, 1, 1, 2, 2]))
    # Rows of one prompt are consecutive copies of its left-padded encoding.
    ids, mask = policy.encode_prompts(tapo_prompts[:3])
    torch.testing.assert_close(batch.prompt_ids, ids.repeat_interleave(2, dim=0))
    torch.testing.assert_close(batch.prompt_mask, mask.repeat_interleave(2, dim=0))
    assert (mask[:, -1] == 1).all(), "prompts are left-padded"
    # Everything after the first EOS is padding, in ids and mask alike.
    eos, pad = tapo_tokenizer.eos_token_id, tapo_tokenizer.pad_token_id
    for row in range(B):
        n_valid = int(batch.completion_mask[row].sum())
        tokens = batch.completion_ids[row].tolist()
        assert eos not in tokens[: n_valid - 1]
        assert n_valid == T or tokens[n_valid - 1] == eos
        assert all(t == pad for t in tokens[n_valid:])
    assert batch.completion_texts == tapo_tokenizer.batch_decode(
        batch.completion_ids, skip_special_tokens=True
    )
    assert batch.old_logp.shape == batch.entropy.shape == (B, T)
    assert (batch.old_logp <= 0).all()
    assert (batch.entropy >= 0).all()
    assert not batch.old_logp.requires_grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_old_logp_is_the_distribution_generate_sampled_from(
    make_model, tapo_tokenizer, tapo_prompts, temperature
):
    """old_logp (recomputed in one forward over [prompt, completion]) equals the log-softmax
    of the scores generate() sampled each token from, through left padding and temperature."""
    model = make_model()
    seen = _spy_generate(model)
    policy = LanguagePolicy(
        model, tapo_tokenizer, SamplingSettings(max_new_tokens=12, temperature=temperature)
    )
    torch.manual_seed(1)
    # Prompts of different lengths, so all but the longest are left-padded.
    batch = policy.sample(["Hi", tapo_prompts[0], tapo_prompts[5]], group_size=2)
    assert len(set(batch.prompt_mask.sum(dim=1).tolist())) == 3
    sampled = torch.log_softmax(seen["scores"].float(), dim=-1)  # (B, T, V)
    sampled = sampled.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    valid = batch.completion_mask.bool()
    torch.testing.assert_close(batch.old_logp[valid], sampled[valid], atol=1e-5, rtol=0)


def test_checkpoint_generation_config_does_not_change_the_sampling_distribution(
    make_model, tapo_tokenizer, tapo_prompts
):
    """A checkpoint's own generation_config (Qwen2.5-Instruct ships repetition_penalty=1.05)
    must not reshape what is sampled: old_logp describes SamplingSettings only."""
    model = make_model()
    model.generation_config.repetition_penalty = 1.5
    model.generation_config.min_p = 0.3
    seen = _spy_generate(model)
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings(max_new_tokens=12))
    torch.manual_seed(2)
    batch = policy.sample(tapo_prompts[:2], group_size=2)
    sampled = torch.log_softmax(seen["scores"].float(), dim=-1)
    sampled = sampled.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    valid = batch.completion_mask.bool()
    torch.testing.assert_close(batch.old_logp[valid], sampled[valid], atol=1e-5, rtol=0)
    assert model.generation_config.repetition_penalty == 1.5, "the model's config is restored"


def test_sample_leaves_train_mode_as_it_was(make_model, tapo_tokenizer, tapo_prompts):
    model = make_model().train()
    LanguagePolicy(model, tapo_tokenizer, SamplingSettings(max_new_tokens=4)).sample(
        tapo_prompts[:1], group_size=2
    )
    assert model.training


def test_recomputed_logp_equals_old_logp_in_train_mode(make_model, tapo_tokenizer, tapo_prompts):
    model = make_model()
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings(max_new_tokens=12))
    torch.manual_seed(3)
    batch = policy.sample(tapo_prompts[:4], group_size=2, with_entropy=True)
    model.train()
    logp, entropy = policy.completion_logprobs(batch, with_entropy=True)
    assert logp.requires_grad
    valid = batch.completion_mask.bool()
    torch.testing.assert_close(logp.detach()[valid], batch.old_logp[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[valid], batch.entropy[valid], atol=1e-5, rtol=0)
    assert policy.completion_logprobs(batch)[1] is None


def test_a_rows_logp_does_not_depend_on_the_rest_of_the_batch(
    make_model, tapo_tokenizer, tapo_prompts
):
    """Left padding (and right padding of completions) must not leak into a row: a batch of two
    prompts of different lengths gives each row the log-probs it gets alone."""
    policy = LanguagePolicy(make_model(), tapo_tokenizer, SamplingSettings(max_new_tokens=12))
    torch.manual_seed(4)
    short, long = "Add 2 and 3.", tapo_prompts[7]
    batch = policy.sample([short, long], group_size=1)
    lengths = batch.prompt_mask.sum(dim=1).tolist()
    assert lengths[0] < lengths[1], "the short prompt is left-padded"
    together, _ = policy.completion_logprobs(batch)
    for row in range(2):
        alone = _alone(batch, row)
        assert alone.prompt_ids.shape[1] == lengths[row]
        logp_alone, _ = policy.completion_logprobs(alone)
        n_valid = alone.completion_ids.shape[1]
        torch.testing.assert_close(logp_alone[0], together[row, :n_valid], atol=1e-5, rtol=0)


def test_policy_needs_a_pad_token(make_model):
    no_pad = types.SimpleNamespace(pad_token_id=None)
    with pytest.raises(ValueError, match="pad token"):
        LanguagePolicy(make_model(), no_pad, SamplingSettings())


@pytest.mark.parametrize("chunk", [1, 7, None])
def test_chunked_scoring_equals_the_single_pass_logits(
    make_model, tapo_tokenizer, tapo_prompts, chunk
):
    """completion_logprobs (the head applied ``chunk`` positions at a time) gives the
    log-softmax of the plain forward's (B, T, V) logits, their top-p entropy, and the gradient
    of that log-softmax."""
    model = make_model()
    sampling = SamplingSettings(max_new_tokens=10, temperature=0.8, logprob_chunk_size=chunk)
    policy = LanguagePolicy(model, tapo_tokenizer, sampling)
    torch.manual_seed(5)
    batch = policy.sample(tapo_prompts[:3], group_size=2, with_logprobs=False)
    model.train()
    logits = policy.completion_logits(batch)  # (B, T, V)
    expected = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(0))
    params = [p for p in model.parameters() if p.requires_grad]
    expected_grads = torch.autograd.grad((expected * g).sum(), params)

    logp, entropy = policy.completion_logprobs(batch, with_entropy=True)
    torch.testing.assert_close(logp, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(entropy, topp_entropy(logits.detach()), atol=1e-6, rtol=1e-6)
    grads = torch.autograd.grad((logp * g).sum(), params)
    # float32 gradients summed over positions in another order (chunk by chunk): seen 1.07e-6
    # apart on an AMD EPYC, within 1e-6 elsewhere.
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_scoring_never_projects_the_whole_batch_at_once(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    """With logprob_chunk_size c the LM head sees at most c positions per call, and inside the
    model's own forward it sees none (output_head_inputs)."""
    model = make_model()
    widths = []
    model.lm_head.register_forward_hook(lambda m, args, out: widths.append(out.shape[:-1]))
    linear = torch.nn.functional.linear
    projected = []

    def recording_linear(x, weight, bias=None):
        if weight is model.lm_head.weight:
            projected.append(x.shape[:-1].numel())  # positions projected
        return linear(x, weight, bias)

    sampling = SamplingSettings(max_new_tokens=6, logprob_chunk_size=4)
    policy = LanguagePolicy(model, tapo_tokenizer, sampling)
    torch.manual_seed(6)
    batch = policy.sample(tapo_prompts[:2], group_size=2, with_logprobs=False)  # N = 4 x 6
    widths.clear()
    monkeypatch.setattr(torch.nn.functional, "linear", recording_linear)
    logp, _ = policy.completion_logprobs(batch)
    logp.sum().backward()
    # Two forwards (shared_prefix): the 2 prompts once, then the 4 rows' completions.
    assert widths == [torch.Size([2, 0]), torch.Size([4, 0])], "the forwards project nothing"
    # The forwards' own (empty) calls, then 6 chunks of 4 positions, forward and backward.
    assert projected == [0, 0] + [4] * 6 * 2


def test_scoring_needs_a_linear_head(make_model, tapo_tokenizer):
    model = make_model()
    model.lm_head = torch.nn.Sequential(model.lm_head)
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings(max_new_tokens=2))
    with pytest.raises(ValueError, match="not a torch.nn.Linear"):
        policy.sample(["Add 2 and 3."], group_size=2)


def test_scoring_refuses_models_that_transform_logits_after_the_head(make_model, tapo_tokenizer):
    """Scoring skips the head inside forward(), so a post-head transform would be lost."""
    model = make_model()
    model.config.final_logit_softcapping = 30.0  # Gemma 2
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings(max_new_tokens=2))
    with pytest.raises(ValueError, match=r"transforms its logits after the head"):
        policy.sample(["Add 2 and 3."], group_size=2)
