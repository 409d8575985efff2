"""The ``lean`` decoder on Qwen2.5-VL against transformers: every decode step's logits against
the plain forward over ``[prompt, completion]`` (3-D rope positions derived by the model),
seeded samples and greedy decodes against ``hf``'s ``model.generate``, and the log-probs and
entropy it reads off its logits against the policy's scoring forward.

A real tiny Qwen2.5-VL (GQA) scores four prompts, one with a wide picture (40 patches instead
of 64), so the prompts are left-padded to different lengths and their 3-D positions differ.
"""

import torch

from creditflow.rollout import SamplingSettings, VisionLanguagePolicy
from creditflow.rollout.backends import rollout_backend
from creditflow.rollout.backends.lean import LeanBackend
from creditflow.rollout.backends.lean_vl import VisionDecoder


def _policies(model, processor, **sampling) -> tuple[VisionLanguagePolicy, VisionLanguagePolicy]:
    settings = SamplingSettings(**{"max_new_tokens": 8, **sampling})
    return (
        VisionLanguagePolicy(model, processor, settings),
        VisionLanguagePolicy(model, processor, settings, backend=LeanBackend()),
    )


def test_lean_is_chosen_for_qwen2_5_vl(make_vl_model):
    model = make_vl_model()
    assert LeanBackend().unsupported_reason(model) is None
    assert isinstance(rollout_backend({"name": "lean"}, model), LeanBackend)


def test_every_step_logits_match_the_plain_forward(make_vl_model, vl_processor, vl_prompts):
    """Prefill once per prompt (G = 2 rows each), then one step per completion token: the
    (B, V) logits of each step are the plain forward's at that position."""
    model = make_vl_model(seed=1)
    hf, lean = _policies(model, vl_processor)
    torch.manual_seed(0)
    batch = hf.sample(vl_prompts, group_size=2, with_logprobs=False)
    T = batch.completion_ids.shape[1]
    encoded = lean.encode_prompts(vl_prompts)
    image_inputs = lean._model_prompt_inputs(encoded)
    decoder = VisionDecoder(
        model,
        LeanBackend().fused_weights(model, version=0),
        image_inputs.pop("input_ids"),
        image_inputs.pop("attention_mask"),
        group_size=2,
        max_new_tokens=T,
        image_inputs=image_inputs,
    )
    with torch.no_grad():
        steps = [decoder.prefill()]
        steps += [decoder.step(batch.completion_ids[:, t]) for t in range(T - 1)]
        expected = hf.completion_logits(batch)  # (B, T, V)
    actual = torch.stack(steps, dim=1)  # (B, T, V)
    mask = batch.completion_mask.bool()
    assert mask.sum() > 2 * len(vl_prompts), "most rows decode several tokens"
    torch.testing.assert_close(actual[mask], expected[mask], rtol=1e-5, atol=1e-5)


def test_seeded_samples_and_scores_equal_hf_and_the_scoring_forward(
    make_vl_model, vl_processor, vl_prompts
):
    """One multinomial draw on the (B, V) probabilities per step, as generate() makes: a seeded
    lean rollout is the seeded hf one, token for token; its old_logp and entropy, read off the
    decoder's logits, are the scoring forward's to float rounding."""
    model = make_vl_model(seed=2)
    hf, lean = _policies(model, vl_processor, temperature=0.8, entropy_top_p=0.9)
    torch.manual_seed(3)
    expected = hf.sample(vl_prompts, group_size=3, with_entropy=True)
    torch.manual_seed(3)
    actual = lean.sample(vl_prompts, group_size=3, with_entropy=True)
    assert torch.equal(actual.completion_ids, expected.completion_ids)
    assert torch.equal(actual.completion_mask, expected.completion_mask)
    assert torch.equal(actual.prompt_ids, expected.prompt_ids)
    for key in ("pixel_values", "image_grid_thw", "mm_token_type_ids"):
        assert torch.equal(actual.extras[key], expected.extras[key])
    mask = expected.completion_mask.bool()
    torch.testing.assert_close(actual.old_logp[mask], expected.old_logp[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(actual.entropy[mask], expected.entropy[mask], rtol=0, atol=1e-5)
    assert (actual.old_logp[~mask] == 0).all() and (actual.entropy[~mask] == 0).all()
    # Without the entropy asked for, none is computed; without either, no scores at all.
    torch.manual_seed(3)
    logp_only = lean.sample(vl_prompts, group_size=3, with_entropy=False)
    assert logp_only.entropy is None and torch.equal(logp_only.old_logp, actual.old_logp)
    torch.manual_seed(3)
    unscored = lean.sample(vl_prompts, group_size=3, with_logprobs=False)
    assert unscored.old_logp.numel() == 0 and unscored.entropy is None


def test_greedy_decodes_equal_hf(make_vl_model, vl_processor, vl_prompts):
    model = make_vl_model(seed=3)
    hf, lean = _policies(model, vl_processor, max_new_tokens=12)
    assert lean.greedy(vl_prompts) == hf.greedy(vl_prompts)


def test_vision_tokens_are_never_sampled(make_vl_model, vl_processor, vl_prompts):
    model = make_vl_model(seed=4)
    _, lean = _policies(model, vl_processor, max_new_tokens=16, temperature=3.0)
    torch.manual_seed(0)
    batch = lean.sample(vl_prompts, group_size=4, with_logprobs=False)
    assert not torch.isin(batch.completion_ids, torch.tensor(lean.vision_ids)).any()


def test_under_autocast_the_scores_come_from_the_scoring_forward(
    make_vl_model, vl_processor, vl_prompts
):
    """bf16 logits of the decoder and of the forward differ beyond float32 rounding, so under
    autocast old_logp is the scoring forward's own, as the loss's ratio needs."""
    model = make_vl_model(seed=5)
    _, lean = _policies(model, vl_processor)
    scored = []
    score = lean.completion_logprobs
    lean.completion_logprobs = lambda *a, **k: scored.append(1) or score(*a, **k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        batch = lean.sample(vl_prompts[:2], group_size=2, with_entropy=True)
    assert scored == [1] and batch.entropy is not None
    lean.sample(vl_prompts[:2], group_size=2, with_entropy=True)
    assert scored == [1], "float32: read off the decoder, no scoring forward"
