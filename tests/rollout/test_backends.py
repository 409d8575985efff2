"""The rollout-backend protocol: the ``hf`` backend against the sampling code it replaced, the
name table, and weight sync through an engine that holds its own (stale) copy of the model."""

import copy
import logging
from typing import ClassVar

import pytest
import torch
from transformers import GenerationConfig

from creditflow.errors import ConfigError
from creditflow.rollout import LanguagePolicy, SamplingSettings, completion_mask_from_eos
from creditflow.rollout import backends as backends_module
from creditflow.rollout.backends import (
    FINISH_LENGTH,
    FINISH_STOP,
    Generation,
    GenerationRequest,
    StaleWeightsError,
    check_rollout_spec,
    finish_reasons,
    rollout_backend,
)
from creditflow.rollout.backends.hf import HFBackend
from creditflow.training.grpo_runs import build_grpo_config
from tests.training.helpers import make_trainer


def sample_before_backends(policy: LanguagePolicy, prompts: list[str], group_size: int):
    """``LanguagePolicy.sample``'s generation as it was before the backends (commit d190a5e):
    the reference the ``hf`` backend must reproduce bit for bit."""
    prompt_ids, prompt_mask = policy.encode_prompts(prompts)
    prompt_ids = prompt_ids.repeat_interleave(group_size, dim=0)
    prompt_mask = prompt_mask.repeat_interleave(group_size, dim=0)
    policy.module.eval()
    s = policy.sampling
    saved = policy.module.generation_config
    policy.module.generation_config = GenerationConfig()
    try:
        output = policy.module.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            max_new_tokens=s.max_new_tokens,
            pad_token_id=policy.tokenizer.pad_token_id,
            eos_token_id=policy.eos_ids,
        )
    finally:
        policy.module.generation_config = saved
    completion_ids = output[:, prompt_ids.shape[1] :]
    mask = completion_mask_from_eos(completion_ids, policy.eos_ids)
    return completion_ids.masked_fill(mask == 0, policy.tokenizer.pad_token_id), mask


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_p": 0.9, "top_k": 20}])
def test_hf_backend_batches_are_bit_identical_to_the_sampling_before_it(
    make_model, tapo_tokenizer, tapo_prompts, sampling
):
    policy = LanguagePolicy(
        make_model(), tapo_tokenizer, SamplingSettings(max_new_tokens=12, **sampling)
    )
    torch.manual_seed(3)
    batch = policy.sample(tapo_prompts[:3], group_size=4)
    torch.manual_seed(3)
    ids, mask = sample_before_backends(policy, tapo_prompts[:3], group_size=4)
    assert torch.equal(batch.completion_ids, ids)
    assert torch.equal(batch.completion_mask, mask)
    assert batch.completion_texts == tapo_tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert batch.sampler_logp is None  # model.generate reports no sampler log-probs


def test_finish_reasons_say_whether_a_row_stopped():
    ids = torch.tensor([[5, 2, 0], [5, 6, 7]])
    assert finish_reasons(ids, [2]) == [FINISH_STOP, FINISH_LENGTH]


def test_a_backend_is_chosen_by_name_with_its_options_checked():
    assert isinstance(rollout_backend({"name": "hf"}), HFBackend)
    assert isinstance(rollout_backend(None), HFBackend)
    with pytest.raises(ConfigError, match=r"unknown rollout backend 'hff' \(did you mean 'hf'"):
        check_rollout_spec({"name": "hff"})
    with pytest.raises(ConfigError, match="unknown rollout backend 'hf' option"):
        check_rollout_spec({"name": "hf", "temperature": 2})
    with pytest.raises(ConfigError, match="needs a `name`"):
        check_rollout_spec({"mode": "colocate"})


class NeverSupported(HFBackend):
    name: ClassVar[str] = "never"

    def unsupported_reason(self, module):
        return "a test backend that supports nothing"


def test_an_unsupported_model_falls_back_to_hf_with_one_log_line(monkeypatch, make_model, caplog):
    monkeypatch.setitem(backends_module.ROLLOUT_BACKENDS, "never", f"{__name__}:NeverSupported")
    monkeypatch.setattr(backends_module, "_logged_fallbacks", set())
    model = make_model()
    with caplog.at_level(logging.INFO, logger="creditflow.rollout.backends"):
        backend = rollout_backend({"name": "never"}, model)
        # A run builds a backend per evaluation: the same fallback is not logged again.
        again = rollout_backend({"name": "never"}, model)
    assert type(backend) is HFBackend and type(again) is HFBackend
    lines = [r.getMessage() for r in caplog.records if "does not support" in r.getMessage()]
    assert len(lines) == 1 and "a test backend that supports nothing" in lines[0]


def test_the_grpo_config_rejects_a_bad_rollout_before_training():
    with pytest.raises(ConfigError, match="rollout: unknown rollout backend 'lena'"):
        build_grpo_config({"rollout": {"name": "lena"}, "rewards": {"length": 1.0}}, ["length"])


# ------------------------------------------------------------ an engine with its own weights
class StaleCopyEngine:
    """A stand-in for vLLM: samples with ``model.generate`` on its own copy of the model, which
    only ``load_weights`` refreshes; reports the version it holds and, on request, sampler
    log-probs off the trainer's by a fixed amount."""

    name: ClassVar[str] = "stale_copy"
    samples_module: ClassVar[bool] = False

    def __init__(self, forget_to_load: bool = False, logp_offset: float | None = None):
        self.forget_to_load = forget_to_load
        self.logp_offset = logp_offset
        self.copy: torch.nn.Module | None = None
        self.version = -1
        self.loads: list[int] = []

    def load_weights(self, module, version):
        self.loads.append(version)
        if self.forget_to_load and self.copy is not None:
            return
        self.copy = copy.deepcopy(module)
        self.version = version

    def generate(self, module, request: GenerationRequest) -> Generation:
        generation = HFBackend().generate(self.copy.eval(), request)
        generation.weights_version = self.version
        if self.logp_offset is not None:
            # Trainer log-probs are filled in by the test's policy hook (see below).
            generation.sampler_logp = torch.zeros(generation.completion_ids.shape)
        return generation


def _trainer(make_model, tokenizer, prompts, backend, **overrides):
    return make_trainer(make_model(), tokenizer, prompts, backend=backend, **overrides)


def _trained(make_model, tokenizer, prompts, backend, **overrides):
    trainer = _trainer(make_model, tokenizer, prompts, backend, steps=3, **overrides)
    return trainer, trainer.train()


def test_an_engine_copy_is_reloaded_after_every_optimizer_step_and_trains_like_hf(
    make_model, tapo_tokenizer, tapo_prompts
):
    engine = StaleCopyEngine()
    trainer, result = _trained(make_model, tapo_tokenizer, tapo_prompts[:4], engine)
    assert engine.loads == [0, 1, 2]  # before each of the 3 rollouts, the step's version
    reference, reference_result = _trained(
        make_model, tapo_tokenizer, tapo_prompts[:4], HFBackend()
    )
    # Same samples (the copy holds the same weights), same updates: only the extra scoring
    # forward (old_logp from the trainer, as for any engine) differs, and it changes nothing.
    for ours, theirs in zip(result.history, reference_result.history, strict=True):
        assert ours["reward/total"] == theirs["reward/total"]
    for p, q in zip(
        trainer.policy.module.parameters(), reference.policy.module.parameters(), strict=True
    ):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_sample_from_stale_weights_fails(make_model, tapo_tokenizer, tapo_prompts):
    engine = StaleCopyEngine(forget_to_load=True)
    with pytest.raises(StaleWeightsError, match="weights version 0, the policy is at 1"):
        _trained(make_model, tapo_tokenizer, tapo_prompts[:4], engine)


def test_truncated_importance_sampling_scales_the_policy_gradient(
    monkeypatch, make_model, tapo_tokenizer, tapo_prompts
):
    """Sampler log-probs log(2) below the trainer's on every token: every ratio is 2, so a cap
    of 1.5 weighs every token's loss by 1.5 and the (unclipped) gradient norm grows 1.5x;
    without the cap the correction is off and only the mismatch is reported."""
    norms = {}
    for cap in (None, 1.5):
        engine = StaleCopyEngine(logp_offset=float(torch.log(torch.tensor(2.0))))
        trainer = _trainer(
            make_model,
            tapo_tokenizer,
            tapo_prompts[:4],
            engine,
            steps=1,
            max_grad_norm=1e9,
            importance_sampling_cap=cap,
        )
        original = trainer.policy.sample

        def sample_with_offset(*args, original=original, engine=engine, **kwargs):
            batch = original(*args, **kwargs)
            batch.sampler_logp = batch.old_logp - engine.logp_offset
            return batch

        monkeypatch.setattr(trainer.policy, "sample", sample_with_offset)
        metrics = trainer.train().history[0]
        torch.testing.assert_close(metrics["rollout/is_ratio_mean"], 2.0, rtol=1e-5, atol=0)
        torch.testing.assert_close(
            metrics["rollout/sampler_logp_abs_diff"], engine.logp_offset, rtol=1e-5, atol=0
        )
        norms[cap] = metrics["actor/grad_norm"]
    torch.testing.assert_close(norms[1.5], 1.5 * norms[None], rtol=1e-4, atol=0)


def test_importance_sampling_needs_an_engine_that_is_not_the_module(
    make_model, tapo_tokenizer, tapo_prompts
):
    with pytest.raises(ConfigError, match="importance_sampling_cap corrects a rollout engine"):
        make_trainer(make_model(), tapo_tokenizer, tapo_prompts[:4], importance_sampling_cap=2.0)


def test_importance_sampling_on_a_backend_that_samples_the_module_fails_in_the_config():
    """Checked from the backend's class when the config is built (before any node runs)."""
    params = {"importance_sampling_cap": 2.0, "rewards": {"length": 1.0}}
    with pytest.raises(ConfigError, match="rollout 'lean' samples the module itself"):
        build_grpo_config(params, ["length"])
    config = build_grpo_config({**params, "rollout": {"name": "vllm"}}, ["length"])
    assert config.importance_sampling_cap == 2.0
