"""The supervised trainer: bit-identical to the text SFT loop it replaced, one epoch sampler,
resumable checkpoints, and configs checked before training."""

import pytest
import torch
from transformers import get_cosine_schedule_with_warmup

from creditflow.config.supervised import SCHEDULE_NAMES
from creditflow.errors import ConfigError
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.sft import SFTConfig, run_sft, train_sft
from creditflow.training.supervised import (
    SCHEDULES,
    EpochSampler,
    SupervisedConfig,
    SupervisedTrainer,
)
from creditflow.training.teacher_forcing import (
    build_sft_examples,
    collate_right_padded,
    completion_nll,
)


# ---------------------------------------------------------------- the loop it replaced
# Verbatim from creditflow.training.sft before the supervised trainer (the reference).
def _old_sft_optimizer(model, config):
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    scheduler = get_cosine_schedule_with_warmup(
        optimizer, min(config.warmup_steps, config.steps), config.steps
    )
    return optimizer, scheduler


def _old_epoch_batches(n_examples, config):
    generator = torch.Generator().manual_seed(config.seed)
    order, cursor = torch.randperm(n_examples, generator=generator).tolist(), 0
    while True:
        rows = []
        while len(rows) < config.batch_size:
            if cursor == len(order):  # next epoch, reshuffled
                order, cursor = torch.randperm(n_examples, generator=generator).tolist(), 0
            rows.append(order[cursor])
            cursor += 1
        yield rows


def _old_train_sft(model, tokenizer, prompts, targets, config, use_chat_template=True):
    examples = build_sft_examples(tokenizer, prompts, targets, config.max_length, use_chat_template)
    device = next(model.parameters()).device
    optimizer, scheduler = _old_sft_optimizer(model, config)
    history = []
    model.train()
    batches = _old_epoch_batches(len(examples), config)
    for step in range(config.steps):
        rows = next(batches)
        batch = collate_right_padded([examples[i] for i in rows], tokenizer.pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = completion_nll(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        history.append(
            {"step": step + 1, "sft/loss": loss.item(), "lr": scheduler.get_last_lr()[0]}
        )
    return history


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different, different


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_train_sft_is_bit_identical_to_the_loop_it_replaced(
    make_model, tapo_tokenizer, tapo_texts, weight_decay
):
    """5 examples in batches of 3 (batches straddle epochs), warm-up then cosine, a clip norm
    small enough to clip every step."""
    half = len(tapo_texts) // 2
    prompts, targets = tapo_texts[:5], tapo_texts[half : half + 5]
    config = SFTConfig(
        steps=6,
        batch_size=3,
        learning_rate=1e-2,
        warmup_steps=2,
        weight_decay=weight_decay,
        max_grad_norm=0.05,
        seed=3,
    )
    old, new = make_model(), make_model()
    expected = _old_train_sft(old, tapo_tokenizer, prompts, targets, config)
    history = train_sft(new, tapo_tokenizer, prompts, targets, config, progress=False)
    assert history == expected
    assert list(history[0]) == ["step", "sft/loss", "lr"]  # the metrics table's columns
    _assert_same_weights(new, old)
    assert not torch.equal(new.lm_head.weight, make_model().lm_head.weight)


@pytest.mark.parametrize(("n", "batch_size", "seed"), [(5, 3, 0), (4, 4, 1), (3, 7, 2), (1, 2, 0)])
def test_epoch_sampler_draws_the_stream_of_epoch_batches(n, batch_size, seed):
    config = SFTConfig(batch_size=batch_size, seed=seed)
    old = _old_epoch_batches(n, config)
    sampler = EpochSampler(n, batch_size, seed)
    for _ in range(12):
        assert sampler.next_batch() == next(old)


def test_epoch_sampler_state_survives_a_save_and_load_mid_epoch(tmp_path):
    sampler = EpochSampler(7, 3, seed=5)
    for _ in range(4):  # 12 rows: one epoch and 5 of the next
        sampler.next_batch()
    torch.save(sampler.state_dict(), tmp_path / "sampler.pt")
    expected = [sampler.next_batch() for _ in range(6)]
    restored = EpochSampler(7, 3, seed=0)  # another seed: everything comes from the state
    restored.load_state_dict(torch.load(tmp_path / "sampler.pt", weights_only=True))
    assert [restored.next_batch() for _ in range(6)] == expected
    with pytest.raises(ValueError, match="for 7 examples, not 8"):
        EpochSampler(8, 3, seed=0).load_state_dict(sampler.state_dict())


# ---------------------------------------------------------------- resume
class _Interrupted(RuntimeError):
    pass


def _regression_task(seed: int = 0):
    """A two-layer MLP with dropout (so resuming must also continue the global generator) on
    24 random (x, y) rows."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(24, 4, generator=g), torch.randn(24, 1, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
    )
    return model, x, y


def _trainer(model, x, y, config, checkpoints=None, stop_after=None):
    calls = []

    def loss_fn(rows):
        if stop_after is not None and len(calls) == stop_after:
            raise _Interrupted  # the process dies during this step
        calls.append(rows)
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        return loss, {"fit/mse": loss.item()}

    trainer = SupervisedTrainer(
        model, len(x), torch.tensor, loss_fn, config, checkpoints, progress=False
    )
    return trainer, calls


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, schedule):
    config = SupervisedConfig(
        steps=9,
        batch_size=5,
        learning_rate=1e-2,
        warmup_steps=2,
        weight_decay=0.01,
        schedule=schedule,
        max_grad_norm=0.5,
        seed=1,
        checkpoint_every=4,
    )
    torch.manual_seed(123)
    reference, x, y = _regression_task()
    torch.manual_seed(7)
    expected = _trainer(reference, x, y, config)[0].train()

    store = CheckpointStore(tmp_path / "run")
    model, _, _ = _regression_task()
    torch.manual_seed(7)
    trainer, calls = _trainer(model, x, y, config, store, stop_after=6)
    with pytest.raises(_Interrupted):
        trainer.train()
    assert store.latest().name == "step-000004" and len(calls) == 6

    torch.manual_seed(999)  # a new process: its own global generator state
    fresh, _, _ = _regression_task(seed=5)  # other starting weights: the checkpoint's are loaded
    resumed, calls = _trainer(fresh, x, y, config, store)
    assert resumed.start_step == 4
    history = resumed.train()
    assert len(calls) == 5 and history == expected
    assert [row["step"] for row in history] == list(range(1, 10))
    _assert_same_weights(fresh, reference)
    assert store.latest().name == "step-000009"

    # A finished run is loaded, not trained again.
    done, _, _ = _regression_task(seed=6)
    finished, calls = _trainer(done, x, y, config, store)
    assert finished.train() == expected and calls == []
    _assert_same_weights(done, reference)


def test_a_checkpoint_of_another_config_is_refused(tmp_path):
    config = SupervisedConfig(steps=2, batch_size=4, learning_rate=1e-2)
    model, x, y = _regression_task()
    store = CheckpointStore(tmp_path)
    _trainer(model, x, y, config, store)[0].train()
    other = SupervisedConfig(steps=2, batch_size=4, learning_rate=2e-2, checkpoint_every=1)
    with pytest.raises(ValueError, match="same config"):
        _trainer(model, x, y, other, store)
    # checkpoint_every only changes what is saved: the run is the same one.
    same = SupervisedConfig(steps=2, batch_size=4, learning_rate=1e-2, checkpoint_every=1)
    assert _trainer(model, x, y, same, store)[0].start_step == 2


def test_run_sft_resumes_its_own_run_from_a_fingerprinted_subdirectory(
    make_model, tapo_tokenizer, tapo_texts, tmp_path
):
    half = len(tapo_texts) // 2
    prompts, targets = tapo_texts[:4], tapo_texts[half : half + 4]
    params = {"steps": 3, "batch_size": 2, "learning_rate": 1e-2, "warmup_steps": 1}
    store = CheckpointStore(tmp_path)
    model = make_model()
    plain, plain_metrics = run_sft(model, tapo_tokenizer, prompts, targets, params)
    first, metrics = run_sft(model, tapo_tokenizer, prompts, targets, params, store)
    (run_dir,) = tmp_path.iterdir()
    assert [p.name for p in CheckpointStore(run_dir).completed()] == ["step-000003"]
    _assert_same_weights(first, plain)
    assert metrics.equals(plain_metrics)
    again, again_metrics = run_sft(model, tapo_tokenizer, prompts, targets, params, store)
    _assert_same_weights(again, plain)
    assert again_metrics.equals(plain_metrics) and not again.training
    # Other data is another run.
    run_sft(model, tapo_tokenizer, prompts[:3], targets[:3], params, store)
    assert len(list(tmp_path.iterdir())) == 2


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"steps": 0}, "steps must be >= 1"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"learning_rate": -1e-3}, "learning_rate must be > 0"),
        ({"schedule": "linear"}, r"unknown schedule 'linear'; valid: constant, cosine"),
        ({"max_grad_norm": 0.0}, "max_grad_norm must be > 0 or None"),
        ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
    ],
)
def test_a_malformed_config_fails_before_training(overrides, message):
    params = {"steps": 2, "batch_size": 2, "learning_rate": 1e-3, **overrides}
    with pytest.raises(ConfigError, match=message):
        SupervisedConfig(**params)


def test_from_params_puts_params_over_the_callers_defaults():
    params = {"steps": 3, "batch_size": 2, "learning_rate": 1, "seed": 4}
    config = SupervisedConfig.from_params(params, schedule="constant", max_grad_norm=None)
    assert config == SupervisedConfig(
        steps=3, batch_size=2, learning_rate=1.0, schedule="constant", max_grad_norm=None, seed=4
    )
    assert type(config.learning_rate) is float  # 1 and 1.0 are the same run
    overridden = SupervisedConfig.from_params({**params, "max_grad_norm": 0.5}, max_grad_norm=None)
    assert overridden.max_grad_norm == 0.5


VALID = {"steps": 2, "batch_size": 2, "learning_rate": 1e-3}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({**VALID, "steps": "abc"}, r"`steps` must be int, got 'abc' \(str\)"),
        ({**VALID, "steps": True}, "`steps` must be int"),
        ({**VALID, "steps": 2.5}, "`steps` must be int"),
        ({**VALID, "learning_rate": "1e-3"}, "`learning_rate` must be float"),
        ({**VALID, "max_grad_norm": "none"}, "`max_grad_norm` must be float or null"),
        ({**VALID, "schedule": 1}, "`schedule` must be str"),
        ({**VALID, "lr": 1e-3}, "`lr` is now `learning_rate`"),
        ({**VALID, "lam": 0.1}, r"unknown supervised key `lam`; valid keys are \['steps', "),
        ({"steps": 2}, r"needs \['batch_size', 'learning_rate'\]"),
        ({**VALID, "steps": 0}, "steps must be >= 1"),  # then the field checks
    ],
)
def test_from_params_rejects_unknown_keys_and_wrong_types(params, message):
    with pytest.raises(ConfigError, match=message):
        SupervisedConfig.from_params(params)


def test_sft_parameters_are_checked_by_the_trainer_rules_too():
    with pytest.raises(ConfigError, match="max_grad_norm"):
        SFTConfig.from_params({"max_grad_norm": -1.0})
    assert SFTConfig.from_params({"max_grad_norm": None}).supervised().max_grad_norm is None


@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
def test_clipping_is_optional_and_covers_the_trained_parameters_only(monkeypatch, max_grad_norm):
    model, x, y = _regression_task()
    first, last = model[0], model[3]
    before = first.weight.clone()
    clipped = []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        torch.nn.utils,
        "clip_grad_norm_",
        lambda ps, norm: clipped.append((ps, norm)) or clip(ps, norm),
    )
    config = SupervisedConfig(
        steps=2, batch_size=8, learning_rate=0.1, schedule="constant", max_grad_norm=max_grad_norm
    )
    trainer, _ = _trainer(model, x, y, config)
    trainer = SupervisedTrainer(
        model,
        len(x),
        torch.tensor,
        trainer.loss_fn,
        config,
        parameters=last.parameters(),
        progress=False,
    )
    history = trainer.train()
    assert [row["lr"] for row in history] == [0.1, 0.1]  # constant: exactly the lr
    assert torch.equal(first.weight, before) and first.weight.grad is not None
    if max_grad_norm is None:
        assert clipped == []
    else:
        assert [norm for _, norm in clipped] == [0.5, 0.5]
        assert all(ps == list(last.parameters()) for ps, _ in clipped)


def test_a_truncated_latest_checkpoint_resumes_from_the_one_before(tmp_path):
    config = SupervisedConfig(steps=6, batch_size=5, learning_rate=1e-2, seed=1, checkpoint_every=2)
    torch.manual_seed(123)
    reference, x, y = _regression_task()
    torch.manual_seed(7)
    expected = _trainer(reference, x, y, config)[0].train()

    store = CheckpointStore(tmp_path / "run", keep=3)
    model, _, _ = _regression_task()
    torch.manual_seed(7)
    trainer, _ = _trainer(model, x, y, config, store, stop_after=5)
    with pytest.raises(_Interrupted):
        trainer.train()
    latest = store.latest()
    assert latest.name == "step-000004"
    state = latest / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])  # marked complete, but cut short

    fresh, _, _ = _regression_task(seed=5)
    resumed, calls = _trainer(fresh, x, y, config, store)
    assert resumed.start_step == 2  # the complete checkpoint before the broken one
    assert resumed.train() == expected and len(calls) == 4
    _assert_same_weights(fresh, reference)


def test_the_torch_free_schedule_names_are_the_trainers_schedules():
    assert sorted(SCHEDULE_NAMES) == sorted(SCHEDULES)
