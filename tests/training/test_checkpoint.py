"""Checkpoints: layout, retention, completeness marker, fingerprints; and bit-exact resume."""

import copy
import gc
import os
import subprocess
import sys

import pytest
import torch

from creditflow.errors import CheckpointsInUse
from creditflow.training import CheckpointStore
from creditflow.training.checkpoint import run_store, state_fingerprint
from tests.training.helpers import make_trainer


def _module(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))


def test_save_and_load_round_trip(tmp_path):
    store = CheckpointStore(tmp_path / "run", keep=2)
    assert store.latest() is None
    source = _module(0)
    path = store.save(10, source, {"history": [{"step": 1.0}], "optimizer": {"lr": 0.1}})
    assert path.name == "step-000010"
    assert sorted(p.name for p in path.iterdir()) == [
        "COMPLETE",
        "model.safetensors",
        "trainer_state.pt",
    ]
    target = _module(1)
    state = store.load(store.latest(), target)
    assert state == {"step": 10, "history": [{"step": 1.0}], "optimizer": {"lr": 0.1}}
    for a, b in zip(source.parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b)


def test_keeps_the_last_k_and_ignores_incomplete_ones(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (1, 2, 3):
        store.save(step, _module(step), {})
    assert [p.name for p in store.completed()] == ["step-000002", "step-000003"]
    # A save killed before COMPLETE was written does not count.
    (tmp_path / "step-000004").mkdir()
    assert store.latest().name == "step-000003"
    assert store.subdirectory("abc").directory == tmp_path / "abc"
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(tmp_path, keep=0)


def test_fingerprint_tracks_weights_and_extras():
    a, b = _module(0), _module(0)
    assert state_fingerprint(a, {"lr": 1}) == state_fingerprint(b, {"lr": 1})
    assert state_fingerprint(a, {"lr": 1}) != state_fingerprint(a, {"lr": 2})
    with torch.no_grad():
        b[0].weight[0, 0] += 1e-6
    assert state_fingerprint(a, {"lr": 1}) != state_fingerprint(b, {"lr": 1})


def _without_timing(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in history]


@pytest.mark.slow
def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path, monkeypatch
):
    """steps=4, checkpoint_every=2, killed when step 3 starts, then resumed: same weights,
    optimizer state and metrics (time/* aside) as a run never interrupted, bit for bit.
    Minibatches, two iterations, KL and warm-up make every piece of state matter."""
    settings = {
        "steps": 4,
        "checkpoint_every": 2,
        "minibatch_size": 4,
        "num_iterations": 2,
        "beta": 0.05,
        "warmup_steps": 3,
        "log_samples_every": 1,
        "samples_per_log": 2,
    }
    straight_model = make_model()
    straight = make_trainer(straight_model, tapo_tokenizer, tapo_prompts, **settings)
    expected = straight.train()

    def trainer(model):
        store = CheckpointStore(tmp_path, keep=1)
        return make_trainer(model, tapo_tokenizer, tapo_prompts, checkpoints=store, **settings)

    first = trainer(make_model())
    step = first.step

    def interrupted(i):
        if i == 2:
            raise KeyboardInterrupt
        return step(i)

    monkeypatch.setattr(first, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    assert CheckpointStore(tmp_path).latest().name == "step-000002"

    resumed_model = make_model()
    resumed = trainer(resumed_model)
    assert resumed.start_step == 2
    result = resumed.train()

    for (name, a), b in zip(
        straight_model.named_parameters(), resumed_model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    assert _without_timing(result.history) == _without_timing(expected.history)
    assert result.samples == expected.samples
    assert resumed.scheduler.state_dict() == straight.scheduler.state_dict()
    for a, b in zip(
        straight.optimizer.state.values(), resumed.optimizer.state.values(), strict=True
    ):
        assert all(torch.equal(a[k], b[k]) for k in a)


class _RunsCode:
    """Pickles to a call of ``os.system``: what a crafted trainer_state.pt would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os  # noqa: PLC0415

        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_trainer_state_is_refused_and_runs_nothing(tmp_path, caplog):
    store = CheckpointStore(tmp_path / "run", keep=3)
    good = _module(0)
    store.save(1, good, {"history": []})
    crafted = store.save(2, _module(1), {"history": []})
    marker = tmp_path / "pwned"
    torch.save({"step": 2, "payload": _RunsCode(marker)}, crafted / "trainer_state.pt")
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        store.load(crafted, _module(2))
    assert not marker.exists(), "loading must not execute anything"
    # Resuming skips it, with a warning, and takes the complete checkpoint before it.
    target = _module(3)
    assert store.load_latest(target) == {"step": 1, "history": []}
    assert not marker.exists()
    assert "does not load" in caplog.text and "step-000002" in caplog.text
    for a, b in zip(good.parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_truncated_checkpoint_falls_back_and_leaves_the_module_alone(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    first, second = _module(0), _module(1)
    store.save(1, first, {})
    latest = store.save(2, second, {})
    weights = latest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-7])  # power lost mid-write, COMPLETE survived
    target = _module(2)
    before = [p.detach().clone() for p in target.parameters()]
    with pytest.raises(Exception):  # noqa: B017 - safetensors' own error type
        store.load(latest, target)
    for a, b in zip(before, target.parameters(), strict=True):
        assert torch.equal(a, b), "a failed load must not half-overwrite the weights"
    assert store.load_latest(target) == {"step": 1}
    for a, b in zip(first.parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b)
    (tmp_path / "step-000001" / "trainer_state.pt").write_bytes(b"")
    assert store.load_latest(_module(4)) is None  # nothing loads: start afresh


def test_a_second_store_on_a_locked_folder_fails_naming_the_holder(tmp_path):
    first = CheckpointStore(tmp_path / "run").lock()
    with pytest.raises(CheckpointsInUse, match=rf"in use by pid {os.getpid()} on .* since "):
        CheckpointStore(tmp_path / "run").lock()
    first.release()
    second = CheckpointStore(tmp_path / "run").lock()  # free again
    del second  # garbage-collected: the lock goes with it
    gc.collect()
    CheckpointStore(tmp_path / "run").lock().release()


def test_the_lock_holds_across_processes_and_dies_with_its_holder(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from creditflow.training.checkpoint import CheckpointStore\n"
            f"store = CheckpointStore({str(tmp_path / 'run')!r}).lock()\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointsInUse, match=rf"pid {holder.pid} "):
            CheckpointStore(tmp_path / "run").lock()
    finally:
        holder.kill()
        holder.wait()
    CheckpointStore(tmp_path / "run").lock().release()  # a killed holder frees it


def test_run_store_comes_locked_and_a_pickled_copy_leaves_the_lock_behind(tmp_path):
    module = torch.nn.Linear(2, 2)
    store = run_store(CheckpointStore(tmp_path), module, {"steps": 1})
    with pytest.raises(CheckpointsInUse):
        run_store(CheckpointStore(tmp_path), module, {"steps": 1})
    run_store(CheckpointStore(tmp_path), module, {"steps": 2}).release()  # another run: free
    # A data-parallel worker receives the store serialised (through __getstate__).
    worker_copy = copy.deepcopy(store)
    assert worker_copy.directory == store.directory and worker_copy._release_lock is None
    worker_copy.save(1, module, {})  # writes under its parent's lock
    assert store.latest() is not None
    store.release()
