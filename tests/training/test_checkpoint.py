"""Checkpoints: layout, retention, completeness marker, fingerprints; and bit-exact resume."""

import copy
import errno
import gc
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors import SafetensorError

from creditflow.errors import CheckpointsInUse, CheckpointWriteError
from creditflow.integrity import file_sha256
from creditflow.training import CheckpointStore
from creditflow.training import checkpoint as checkpoint_module
from creditflow.training.checkpoint import (
    DamagedCheckpointError,
    run_store,
    state_fingerprint,
)
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
    with pytest.raises(DamagedCheckpointError, match="trainer_state.pt is damaged"):
        store.load(crafted, _module(2))
    # Whoever can write trainer_state.pt can rewrite COMPLETE's checksums too: weights_only
    # is what refuses the payload.
    _reseal(crafted)
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


# --- damaged contents under an intact COMPLETE ------------------------------------------------


def _wide_module(seed: int) -> torch.nn.Module:
    """Weights of 64*64*4 + 64*4 + 64*4 + 4 = 16,900 bytes: room for 4 KiB of damage."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))


def _reseal(path):
    """Record the checksums of the files as they are now, as a writer of the marker would."""
    marker = json.loads((path / "COMPLETE").read_text())
    marker["sha256"] = {name: file_sha256(path / name) for name in marker["sha256"]}
    (path / "COMPLETE").write_text(json.dumps(marker))


def _overwrite(file, offset: int, data: bytes) -> None:
    with open(file, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _assert_same_weights(expected: torch.nn.Module, actual: torch.nn.Module) -> None:
    for (name, a), b in zip(expected.named_parameters(), actual.parameters(), strict=True):
        assert torch.equal(a, b), name


def _two_checkpoints(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    older = _wide_module(0)
    store.save(1, older, {"history": [1.0]})
    newest = store.save(2, _wide_module(1), {"history": [1.0, 2.0]})
    return store, older, newest


def test_a_checkpoint_records_the_sha256_of_each_file_and_loads_unchanged(tmp_path):
    store = CheckpointStore(tmp_path)
    source = _wide_module(0)
    path = store.save(7, source, {"history": [0.5]})
    marker = json.loads((path / "COMPLETE").read_text())
    assert marker == {
        "step": 7,
        "sha256": {
            name: hashlib.sha256((path / name).read_bytes()).hexdigest()
            for name in ("model.safetensors", "trainer_state.pt")
        },
    }
    target = _wide_module(1)
    assert store.load_latest(target) == {"step": 7, "history": [0.5]}
    _assert_same_weights(source, target)


def test_zeroed_bytes_in_the_weights_fall_back_naming_the_file(tmp_path, caplog):
    store, older, newest = _two_checkpoints(tmp_path)
    weights = newest / "model.safetensors"
    size = weights.stat().st_size
    assert size > 3 * 4096
    _overwrite(weights, size // 2 - 2048, bytes(4096))  # a lost 4 KiB page, COMPLETE intact
    target = _wide_module(2)
    before = [p.detach().clone() for p in target.parameters()]
    with pytest.raises(DamagedCheckpointError, match=r"step-000002/model\.safetensors is damaged"):
        store.load(newest, target)
    for a, b in zip(before, target.parameters(), strict=True):
        assert torch.equal(a, b), "a refused load must leave the module alone"
    assert store.load_latest(target) == {"step": 1, "history": [1.0]}
    _assert_same_weights(older, target)
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert f"{newest}/model.safetensors is damaged" in warning.getMessage()
    assert store.latest().name == "step-000001"


def test_flipped_bytes_in_the_trainer_state_fall_back_naming_the_file(tmp_path, caplog):
    store, older, newest = _two_checkpoints(tmp_path)
    state = newest / "trainer_state.pt"
    middle = state.stat().st_size // 2
    flipped = bytes(b ^ 0xFF for b in state.read_bytes()[middle : middle + 8])
    _overwrite(state, middle, flipped)
    target = _wide_module(2)
    assert store.load_latest(target) == {"step": 1, "history": [1.0]}
    _assert_same_weights(older, target)
    assert f"{newest}/trainer_state.pt is damaged" in caplog.text


def test_non_finite_weights_or_optimizer_state_fall_back_naming_the_tensor(tmp_path, caplog):
    store = CheckpointStore(tmp_path, keep=3)
    older = _wide_module(0)
    store.save(1, older, {})
    diverged = _wide_module(1)
    with torch.no_grad():
        diverged[1].bias[0] = float("nan")
    # Saved as it is, so the checksums match: only the tensor check can tell.
    nan_weights = store.save(2, diverged, {})
    target = _wide_module(2)
    with pytest.raises(DamagedCheckpointError, match=r"tensor '1\.bias' holds NaN or inf"):
        store.load(nan_weights, target)
    assert store.load_latest(target) == {"step": 1}
    _assert_same_weights(older, target)
    assert "step-000002/model.safetensors: tensor '1.bias' holds NaN or inf" in caplog.text

    moments = {"state": {0: {"exp_avg": torch.tensor([0.0, float("inf")])}}, "param_groups": []}
    store.save(3, _wide_module(3), {"optimizer": moments})
    assert store.load_latest(target) == {"step": 1}
    assert "trainer_state.pt: tensor 'optimizer.state.0.exp_avg' holds NaN or inf" in caplog.text


def test_a_garbled_marker_falls_back_and_a_step_only_marker_loads_unverified(tmp_path, caplog):
    store, older, newest = _two_checkpoints(tmp_path)
    (newest / "COMPLETE").write_bytes(b"\x00" * 8)
    target = _wide_module(2)
    assert store.load_latest(target) == {"step": 1, "history": [1.0]}
    assert f"{newest}/COMPLETE is not a checkpoint marker" in caplog.text

    # A marker holding only the step records no checksums: nothing to verify.
    (newest / "COMPLETE").write_text("2")
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="creditflow.training.checkpoint"):
        assert store.load_latest(target) == {"step": 2, "history": [1.0, 2.0]}
    assert "records no checksums" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_missing_file_the_marker_records_falls_back(tmp_path, caplog):
    store, older, newest = _two_checkpoints(tmp_path)
    (newest / "trainer_state.pt").unlink()
    assert store.latest().name == "step-000001"
    assert f"{newest}/trainer_state.pt is missing" in caplog.text


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


# --- a full disk while saving -----------------------------------------------------------------
# What each writer raised on a full tmpfs (measured with the script of the test below).
FULL_DISK = {
    "torch.save": RuntimeError(
        "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
    ),
    "safetensors": SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    ),
    "COMPLETE": OSError(errno.ENOSPC, "No space left on device"),
}


def _fail_like_a_full_disk(monkeypatch, writer: str) -> None:
    """Make ``writer`` leave a partial file and raise what it raised on a full disk."""

    def fail(_, where, *args, **kwargs):
        with open(where, "wb") as f:
            f.write(b"PK\x03\x04 half a file")
        raise FULL_DISK[writer]

    if writer == "torch.save":
        monkeypatch.setattr(torch, "save", fail)
    elif writer == "safetensors":
        monkeypatch.setattr(checkpoint_module, "save_model", fail)
    else:
        real = checkpoint_module.Path.write_text

        def write_text(self, text, *args, **kwargs):
            if self.name == "COMPLETE":
                raise FULL_DISK[writer]
            return real(self, text, *args, **kwargs)

        monkeypatch.setattr(checkpoint_module.Path, "write_text", write_text)


@pytest.mark.parametrize("writer", list(FULL_DISK))
def test_a_full_disk_names_the_folder_the_free_space_and_the_intact_previous_checkpoint(
    tmp_path, monkeypatch, writer
):
    # Before: the run died with torch's "[enforce fail at inline_container.cc:672] . unexpected
    # pos 576 vs 534" (or safetensors' error) naming no folder, the half-written step left behind.
    store = CheckpointStore(tmp_path / "run", keep=1)
    first = _module(0)
    previous = store.save(1, first, {"history": [1.0]})
    _fail_like_a_full_disk(monkeypatch, writer)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=123_456))
    with pytest.raises(CheckpointWriteError) as error:
        store.save(2, _module(1), {"history": [1.0, 2.0]})
    message = str(error.value)
    assert message.startswith(
        f"could not write checkpoint step-000002 in {store.directory}: the disk is full "
        f"({type(FULL_DISK[writer]).__name__}: {FULL_DISK[writer]}); 120.6 KiB (123,456 bytes) "
        "free on that file system. The half-written step-000002 was removed; the previous "
        f"checkpoint {previous} is intact and running the same command again resumes from it."
    )
    assert isinstance(error.value.__cause__, type(FULL_DISK[writer]))
    monkeypatch.undo()
    assert [p.name for p in store.directory.iterdir() if p.name.startswith("step-")] == [
        "step-000001"
    ]
    target = _module(2)
    assert store.load_latest(target) == {"step": 1, "history": [1.0]}
    for a, b in zip(first.parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_failed_first_save_and_other_write_errors_say_what_they_are(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path / "run")
    _fail_like_a_full_disk(monkeypatch, "torch.save")
    with pytest.raises(CheckpointWriteError, match="there is no earlier checkpoint: running the "):
        store.save(1, _module(0), {})
    monkeypatch.setattr(checkpoint_module, "fsync_path", _raise(OSError(errno.EIO, "I/O error")))
    monkeypatch.setattr(torch, "save", _raise(None))
    with pytest.raises(CheckpointWriteError, match=r"the write failed \(OSError: \[Errno 5\]"):
        store.save(1, _module(0), {})


def _raise(error):
    def fail(*args, **kwargs):
        if error is not None:
            raise error

    return fail


# On a 64 KiB tmpfs: a tiny checkpoint, then one whose weights do not fit (safetensors fails),
# then, in a second folder, one whose trainer state does not fit (torch.save fails).
_FULL_TMPFS_SCRIPT = """
import sys
import torch
from creditflow.errors import CheckpointWriteError
from creditflow.training import CheckpointStore
for name, too_big in (("run_weights", "weights"), ("run_state", "state")):
    store = CheckpointStore(f"{sys.argv[1]}/{name}", keep=1)
    store.save(1, torch.nn.Linear(3, 2), {"history": []})
    big = torch.nn.Linear(300, 300) if too_big == "weights" else torch.nn.Linear(3, 2)
    try:
        store.save(2, big, {"history": [0.0] * (60_000 if too_big == "state" else 1)})
    except CheckpointWriteError as error:
        print(error)
        print(name, "cause:", type(error.__cause__).__name__)
"""


def _can_mount_a_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_a_tmpfs(), reason="needs unshare -rm to mount a small tmpfs")
def test_a_really_full_disk_raises_the_named_error(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(textwrap.dedent(_FULL_TMPFS_SCRIPT))
    run = subprocess.run(
        [
            "unshare", "-rm", "sh", "-c",
            f"mount -t tmpfs -o size=64k tmpfs {mount} && {sys.executable} {script} {mount}",
        ],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    for name, cause in (("run_weights", "SafetensorError"), ("run_state", "RuntimeError")):
        folder = f"{mount}/{name}"
        assert f"could not write checkpoint step-000002 in {folder}: the disk is full" in run.stdout
        assert f"the previous checkpoint {folder}/step-000001 is intact" in run.stdout
        assert f"{name} cause: {cause}" in run.stdout


def test_saving_after_a_fallback_replaces_the_damaged_later_checkpoints(tmp_path, caplog):
    # Resumed from step 1 because steps 2 and 3 are damaged: the next save (step 2 again)
    # must survive the keep rule, and no damaged folder may outrank it at the next resume.
    store = CheckpointStore(tmp_path, keep=3)
    store.save(1, _wide_module(0), {"history": [1.0]})
    damaged = [store.save(s, _wide_module(s), {"history": [float(s)]}) for s in (2, 3)]
    store.keep = 2  # as a rerun with keep_checkpoints 2 would have it
    for path in damaged:
        _overwrite(path / "model.safetensors", 100, bytes(64))
    assert store.load_latest(_wide_module(9))["step"] == 1
    written = store.save(2, _wide_module(5), {"history": [1.0, 2.0]})
    assert [p.name for p in store.completed()] == ["step-000001", "step-000002"]
    assert store.latest() == written and store.load_latest(_wide_module(9))["step"] == 2
    assert "step-000003: this run resumed before it" in caplog.text
