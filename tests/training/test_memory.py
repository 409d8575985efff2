"""The GRPO engine's memory settings: micro-batches with gradient accumulation,
chunked scoring, gradient checkpointing and bf16 autocast, each against the plain step."""

import copy

import pytest
import torch

from creditflow.config.grpo import check_process_layout
from creditflow.errors import ConfigError
from creditflow.training import GRPOConfig
from creditflow.training import memory as memory_module
from tests.training.helpers import make_trainer, spy

AGG_MODES = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


def _update_inputs(trainer, model, prompts, seed=1):
    """A rollout batch scored by the sampling policy (B = 8, T = 8), then a policy moved off it (ratios != 1,
    clipping exercised), random token advantages and weights, and reference log-probs."""
    torch.manual_seed(0)
    batch = trainer.policy.sample(prompts[:2], group_size=4)  # B = 8, with old_logp
    B, T = batch.completion_ids.shape
    # The untrained policy never stops early: give the rows different lengths (one empty), so
    # the per-sequence and per-token normalisers of the micro-batches differ.
    lengths = torch.tensor([8, 3, 5, 1, 8, 6, 2, 0])
    batch.completion_mask = (torch.arange(T)[None] < lengths[:, None]).float()  # (B, T)
    g = torch.Generator().manual_seed(seed)
    advantages = torch.randn(B, T, generator=g) * batch.completion_mask
    weights = torch.rand(B, T, generator=g) * batch.completion_mask
    ref_logp = batch.old_logp + 0.1 * torch.randn(B, T, generator=g)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return batch, advantages, weights, ref_logp


def _trainer_pair(make_model, tokenizer, prompts, **settings):
    """Two trainers of identical models: the plain step, and one with ``settings``."""
    common = {"beta": 0.1, "max_grad_norm": 1e9, "clip_low": 0.1, "clip_high": 0.3}
    model = make_model()
    plain = make_trainer(model, tokenizer, prompts, **common, **settings.pop("plain", {}))
    inputs = _update_inputs(plain, model, prompts)
    twin = copy.deepcopy(model)
    other = make_trainer(twin, tokenizer, prompts, **common, **settings)
    return (plain, model), (other, twin), inputs


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("micro_batch_size", [1, 2, 4])
def test_micro_batches_give_the_full_batch_loss_gradient_and_step(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch, agg, micro_batch_size
):
    """One optimizer step of B = 8 rows in micro-batches: the same loss, metrics, gradient and
    updated weights as the step in one pass, for every aggregation (the normalisers differ:
    sequences for the seq-mean modes, tokens for token-mean), with per-token weights and KL."""
    (plain, model), (micro, twin), (batch, adv, weights, ref) = _trainer_pair(
        make_model,
        tapo_tokenizer,
        tapo_prompts,
        agg=agg,
        micro_batch_size=micro_batch_size,
        plain={"agg": agg},
    )
    lengths = batch.completion_mask.sum(dim=1)
    assert lengths.min() < lengths.max(), "rows of different lengths"
    model.train(), twin.train()
    expected = plain.optimizer_step(batch, adv, weights, ref)
    forwards = spy(monkeypatch, micro.policy, "completion_logprobs")
    got = micro.optimizer_step(batch, adv, weights, ref)

    assert [call[0].batch_size for call in forwards] == [micro_batch_size] * (8 // micro_batch_size)
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6, rel=1e-5), key
    assert 0 < got["actor/clip_frac"] < 1 and got["actor/kl"] > 0
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5, msg=name)
        # Adam's first step is ~lr * sign(grad): float noise on a gradient element near eps
        # moves it by more than the noise, hence 1% of lr.
        torch.testing.assert_close(q, p, atol=1e-4, rtol=0, msg=name)


def test_micro_batch_size_must_divide_the_minibatch():
    base = {"prompts_per_step": 2, "group_size": 4, "rewards": {"length": 1.0}}
    assert GRPOConfig.from_params({**base, "micro_batch_size": 8}).micro_batch_size == 8
    with pytest.raises(ConfigError, match=r"micro_batch_size \(3\) must divide the minibatch"):
        GRPOConfig.from_params({**base, "micro_batch_size": 3})
    with pytest.raises(ConfigError, match=r"minibatch_size = 4\); pick a divisor of 4"):
        GRPOConfig.from_params({**base, "minibatch_size": 4, "micro_batch_size": 8})
    with pytest.raises(ConfigError, match="micro_batch_size"):
        GRPOConfig.from_params({**base, "micro_batch_size": 0})
    with pytest.raises(ConfigError, match="logprob_chunk_size"):
        GRPOConfig.from_params({**base, "logprob_chunk_size": 0})
    # Per process: 2 processes hold 4 of the 8 rows each, which 8 does not divide.
    config = GRPOConfig.from_params({**base, "micro_batch_size": 8})
    with pytest.raises(ConfigError, match=r"its share of the minibatch \(4 with 2 processes\)"):
        check_process_layout(config, 2)


@pytest.mark.parametrize("chunk", [1, 5])
def test_chunked_scoring_gives_the_same_step(make_model, tapo_tokenizer, tapo_prompts, chunk):
    """logprob_chunk_size reaches the policies (and the reference) and changes nothing but
    float rounding in the step."""
    (plain, model), (chunked, twin), (batch, adv, weights, ref) = _trainer_pair(
        make_model, tapo_tokenizer, tapo_prompts, logprob_chunk_size=chunk
    )
    assert chunked.policy.sampling.logprob_chunk_size == chunk
    assert chunked.reference.sampling.logprob_chunk_size == chunk
    model.train(), twin.train()
    expected = plain.optimizer_step(batch, adv, weights, ref)
    got = chunked.optimizer_step(batch, adv, weights, ref)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6, rel=1e-5), key
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_gradient_checkpointing_gives_the_same_gradients(make_model, tapo_tokenizer, tapo_prompts):
    (plain, model), (checkpointed, twin), (batch, adv, weights, ref) = _trainer_pair(
        make_model, tapo_tokenizer, tapo_prompts, gradient_checkpointing=True
    )
    assert twin.is_activation_checkpointing and not model.is_activation_checkpointing
    assert not checkpointed.reference.module.is_activation_checkpointing, "no backward there"
    model.train(), twin.train()
    expected = plain.optimizer_step(batch, adv, weights, ref)
    got = checkpointed.optimizer_step(batch, adv, weights, ref)
    assert got["actor/loss"] == pytest.approx(expected["actor/loss"], abs=1e-6)
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5, msg=name)
    # The rollout (eval mode) still samples and scores as before.
    assert checkpointed.step(0)["actor/grad_norm"] > 0


def test_gradient_checkpointing_needs_a_transformers_model():
    config = GRPOConfig.from_params(
        {"prompts_per_step": 1, "group_size": 2, "gradient_checkpointing": True}
    )
    module = torch.nn.Linear(2, 2)  # e.g. the pointer reranker
    with pytest.raises(ConfigError, match="gradient_checkpointing needs a transformers model"):
        memory_module.prepare_memory(module, config)


def test_bf16_autocasts_every_forward_but_not_the_backward(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    """bf16: the rollout, the reference and the update forward run under bfloat16 autocast (the
    log-probs are float32), the step trains, and its gradient is the float32 one to bf16
    precision."""
    (plain, model), (bf16, twin), (batch, adv, weights, ref) = _trainer_pair(
        make_model, tapo_tokenizer, tapo_prompts, bf16=True
    )
    seen = []
    for policy in (bf16.policy, bf16.reference):
        score = policy.completion_logprobs

        def recording(batch, with_entropy=False, score=score):
            seen.append(torch.is_autocast_enabled("cpu"))
            out = score(batch, with_entropy)
            assert out[0].dtype == torch.float32
            return out

        monkeypatch.setattr(policy, "completion_logprobs", recording)
    generate = []  # autocast on at each rollout's generate (whichever backend samples)
    backend_generate = bf16.policy.backend.generate

    def recording_generate(*args, **kwargs):
        generate.append(torch.is_autocast_enabled("cpu"))
        return backend_generate(*args, **kwargs)

    monkeypatch.setattr(bf16.policy.backend, "generate", recording_generate)
    backward = torch.Tensor.backward
    in_backward = []

    def recording_backward(self, *args, **kwargs):
        in_backward.append(torch.is_autocast_enabled("cpu"))
        return backward(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", recording_backward)

    model.train(), twin.train()
    plain.optimizer_step(batch, adv, weights, ref)
    bf16.optimizer_step(batch, adv, weights, ref)
    assert seen == [True] and in_backward == [False, False]
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert q.dtype == torch.float32, "the weights stay float32"
        cosine = torch.nn.functional.cosine_similarity(q.grad.flatten(), p.grad.flatten(), dim=0)
        assert cosine > 0.99, name

    seen.clear()
    metrics = bf16.step(0)  # rollout scoring skipped (one optimizer step): reference + update
    assert seen == [True, True] and generate == [True]
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_bf16_fails_before_training_on_a_device_without_it(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    monkeypatch.setattr(memory_module, "supports_bf16", lambda device_type: False)
    with pytest.raises(ConfigError, match="bf16 is set but this cpu device"):
        make_trainer(make_model(), tapo_tokenizer, tapo_prompts, bf16=True)
