"""LoRA policies in the engines: only the adapters train, in GRPO, SFT and VL SFT;
GRPO's KL reference is the base model with the adapters disabled (no second copy), so its
log-probs stay the initial policy's; a LoRA run's checkpoints hold its adapters and resume.

The VL fixtures are imported from the rollout tests and requested by name as parameters.
"""

# ruff: noqa: F811

import pytest
import torch

from creditflow.models.lora import ADAPTER_WEIGHTS, LoraSpec, adapter_state_dict, add_lora
from creditflow.rollout import SamplingSettings, VisionLanguagePolicy
from creditflow.training.checkpoint import MODEL_WEIGHTS, CheckpointStore
from creditflow.training.grpo_runs import grpo_policy
from creditflow.training.reference import AdapterDisabledReference, frozen_reference
from creditflow.training.sft import SFTConfig, run_sft, train_sft
from creditflow.training.teacher_forcing import target_batch
from tests.rollout.test_vision_policy import (  # noqa: F401 - fixtures are found by name
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)
from tests.training.conftest import FORMAT_PAIRS
from tests.training.helpers import make_trainer, spy

pytest.importorskip("peft")

LORA = LoraSpec(r=4, alpha=8.0, target_modules=("q_proj", "v_proj"))


def _split(model) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base weights, adapter weights) of a LoRA model, cloned."""
    base, adapter = {}, {}
    for name, parameter in model.named_parameters():
        (adapter if "lora_" in name else base)[name] = parameter.detach().clone()
    return base, adapter


def _assert_only_adapters_moved(before, after) -> None:
    (base0, adapter0), (base1, adapter1) = before, after
    assert base0.keys() == base1.keys() and adapter0.keys() == adapter1.keys()
    for name, weight in base0.items():
        assert torch.equal(base1[name], weight), name
    # B starts at 0 (the adapter adds nothing at first); every B must have left it.
    moved = [n for n in adapter0 if "lora_B" in n and not torch.equal(adapter0[n], adapter1[n])]
    assert moved == [n for n in adapter0 if "lora_B" in n]


def test_grpo_trains_the_adapters_against_the_base_as_reference(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    model = add_lora(make_model(), LORA)
    initial = make_model()  # the same base weights, no adapters: the initial policy
    before = _split(model)
    trainer = make_trainer(model, tapo_tokenizer, tapo_prompts, beta=0.1, steps=2)
    reference = trainer.reference
    assert isinstance(reference, AdapterDisabledReference)
    assert reference.module is model  # no second copy of the weights
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimised == {id(p) for n, p in model.named_parameters() if "lora_" in n}
    updates = spy(monkeypatch, trainer, "update")
    history = trainer.train().history

    _assert_only_adapters_moved(before, _split(model))
    # Step 2 samples from the moved policy; the reference log-probs its update got are still
    # the initial policy's, and the policy's own differ from them (so its adapters are back on).
    _, batch, _, _, ref_logp = updates[1]
    with torch.no_grad():
        initial_policy = grpo_policy(initial, tapo_tokenizer, trainer.config)
        initial_logp, _ = initial_policy.completion_logprobs(batch)  # (B, T)
        policy_logp, _ = trainer.policy.completion_logprobs(batch)  # (B, T)
    valid = batch.completion_mask.bool()
    torch.testing.assert_close(ref_logp[valid], initial_logp[valid], rtol=0, atol=1e-6)
    assert (policy_logp - initial_logp)[valid].abs().max() > 1e-4
    assert history[1]["actor/kl"] > 0


def test_a_plain_policy_still_gets_a_frozen_copy(make_model, tapo_tokenizer, tapo_prompts):
    trainer = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, steps=1)
    reference = frozen_reference(trainer.policy)
    assert not isinstance(reference, AdapterDisabledReference)
    assert reference.module is not trainer.policy.module
    assert not any(p.requires_grad for p in reference.module.parameters())


def test_sft_trains_only_the_adapters(make_model, tapo_tokenizer):
    model = add_lora(make_model(), LORA)
    before = _split(model)
    prompts, targets = zip(*FORMAT_PAIRS, strict=True)
    config = SFTConfig(steps=3, batch_size=4, learning_rate=1e-2, warmup_steps=0)
    history = train_sft(model, tapo_tokenizer, list(prompts), list(targets), config, progress=False)
    assert len(history) == 3
    _assert_only_adapters_moved(before, _split(model))


def test_vl_sft_trains_only_the_adapters_of_the_language_model(
    make_vl_model, vl_processor, vl_prompts
):
    model = add_lora(make_vl_model(), LORA)
    # q_proj / v_proj are the language model's; the vision tower's attention is one qkv.
    assert all(".language_model." in n for n in adapter_state_dict(model))
    before = _split(model)
    targets = ["1 + 2 = 3. The answer is \\boxed{3}", "There are 4. \\boxed{4}"] * 2
    config = {"steps": 3, "batch_size": 4, "learning_rate": 1e-2, "warmup_steps": 0}
    trained, _ = run_sft(model, vl_processor, vl_prompts, targets, config)
    _assert_only_adapters_moved(before, _split(trained))
    # With its adapters disabled the trained policy scores as the untrained model does.
    policy = VisionLanguagePolicy(trained, vl_processor, SamplingSettings())
    eos = vl_processor.tokenizer.eos_token_id
    target_ids = [vl_processor.tokenizer(t)["input_ids"] + [eos] for t in targets]
    batch = target_batch(policy, vl_prompts, target_ids)
    with torch.no_grad():
        reference_logp, _ = AdapterDisabledReference(policy).completion_logprobs(batch)
        initial = VisionLanguagePolicy(make_vl_model(), vl_processor, SamplingSettings())
        initial_logp, _ = initial.completion_logprobs(batch)
    valid = batch.completion_mask.bool()
    torch.testing.assert_close(reference_logp[valid], initial_logp[valid], rtol=0, atol=1e-6)


def test_a_lora_checkpoint_holds_the_adapter_only_and_loads_into_a_fresh_one(
    make_model, tmp_path, caplog
):
    model = add_lora(make_model(), LORA)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.5)
    store = CheckpointStore(tmp_path / "run")
    path = store.save(1, model, {"note": "x"})
    assert (path / ADAPTER_WEIGHTS).is_file() and not (path / MODEL_WEIGHTS).exists()

    fresh = add_lora(make_model(), LORA)
    assert store.load_latest(fresh)["note"] == "x"
    for name, tensor in adapter_state_dict(model).items():
        assert torch.equal(adapter_state_dict(fresh)[name], tensor), name
    # Adapters on other modules do not fit: reported, and the run starts afresh.
    other = add_lora(make_model(), LoraSpec(r=4, alpha=8.0, target_modules=("k_proj",)))
    untouched = adapter_state_dict(other)
    assert store.load_latest(other) is None
    assert "does not load" in caplog.text and "do not fit the model" in caplog.text
    for name, tensor in adapter_state_dict(other).items():
        assert torch.equal(untouched[name], tensor), name


def _without_timing(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in history]


def test_an_interrupted_lora_run_resumes_to_the_uninterrupted_result(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path, monkeypatch
):
    """steps=4, checkpoint_every=2, killed when step 3 starts, then resumed from the adapter
    checkpoint: the same adapters, optimizer state and metrics as an uninterrupted run."""
    settings = {"steps": 4, "checkpoint_every": 2, "beta": 0.05, "warmup_steps": 3}
    straight_model = add_lora(make_model(), LORA)
    straight = make_trainer(straight_model, tapo_tokenizer, tapo_prompts, **settings)
    expected = straight.train()

    def trainer(model):
        store = CheckpointStore(tmp_path, keep=1)
        return make_trainer(model, tapo_tokenizer, tapo_prompts, checkpoints=store, **settings)

    first = trainer(add_lora(make_model(), LORA))
    step = first.step

    def interrupted(i):
        if i == 2:
            raise KeyboardInterrupt
        return step(i)

    monkeypatch.setattr(first, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    assert (CheckpointStore(tmp_path).latest() / ADAPTER_WEIGHTS).is_file()

    resumed_model = add_lora(make_model(), LORA)
    resumed = trainer(resumed_model)
    assert resumed.start_step == 2
    result = resumed.train()
    for (name, a), b in zip(
        straight_model.named_parameters(), resumed_model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    assert _without_timing(result.history) == _without_timing(expected.history)
    for a, b in zip(
        straight.optimizer.state.values(), resumed.optimizer.state.values(), strict=True
    ):
        assert all(torch.equal(a[k], b[k]) for k in a)
