"""Resumable training checkpoints: weights in safetensors, trainer state beside them.

Layout: ``<directory>/step-000010/{model.safetensors, trainer_state.pt, COMPLETE}`` (a LoRA
model: ``adapter_model.safetensors``, its adapter weights, instead of ``model.safetensors``). A
checkpoint counts only once ``COMPLETE`` is written, last, after the files and the folder are
fsynced: a run killed mid-save, or a machine that loses power, resumes from the previous one.
``COMPLETE`` holds JSON, ``{"step": 10, "sha256": {"model.safetensors": "<hex>", ...}}``: the
SHA-256 of every file the checkpoint holds, taken as it was written. Loading checks those
first, then that every floating-point weight and optimizer-state tensor is finite, so a
checkpoint marked complete that is damaged (a disk that lied about its sync, flipped or
zeroed bytes, a file edited by hand, weights gone NaN) is reported naming the file or tensor,
and resuming takes the previous complete one. A ``COMPLETE`` holding only the step number as
text records no checksums: its files are loaded unverified. A save that fails (a
full disk, which ``torch.save`` reports as ``[enforce fail at inline_container.cc:672] .
unexpected pos 576 vs 534``) removes its half-written folder and raises
``CheckpointWriteError`` naming the folder, the cause, the free space and the previous
checkpoint, which a save never touches before its own is complete. The trainer state
loads with ``torch.load(weights_only=True)``: tensors and plain containers only, so a crafted
``trainer_state.pt`` cannot run code on resume.

One writer per run: ``run_store`` takes an exclusive lock on the run's folder (``flock`` on
``<directory>/.lock``, released when the store is released or garbage-collected, or when its
process dies), so a second run with the same fingerprint fails at once with a message naming
the holder instead of interleaving its steps with the first run's. The lock is advisory and
local: on a network file system without ``flock`` support it does not protect.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from creditflow.errors import CheckpointsInUse, CheckpointWriteError
from creditflow.integrity import file_sha256
from creditflow.models.lora import (
    ADAPTER_WEIGHTS,
    adapter_state_dict,
    is_lora_model,
    load_adapter_state_dict,
)
from creditflow.training.finite import first_non_finite_parameter

logger = logging.getLogger(__name__)

_PREFIX = "step-"
MODEL_WEIGHTS = "model.safetensors"
TRAINER_STATE = "trainer_state.pt"
MARKER = "COMPLETE"
LOCK_FILE = ".lock"
# A full disk as each writer reports it (measured on a full tmpfs): an OSError's errno
# (ENOSPC; EDQUOT for a quota); safetensors' Rust I/O error ("No space left on device (os
# error 28)"); torch.save's zip writer, which sees only a short write ("unexpected pos 576 vs
# 534"; "file write failed" for a large tensor).
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = (
    "No space left on device",
    "Disk quota exceeded",
    "unexpected pos",
    "file write failed",
)


class DamagedCheckpointError(ValueError):
    """A checkpoint marked complete whose contents are not what was saved: a file whose
    SHA-256 differs from the one ``COMPLETE`` recorded, a missing file, an unreadable
    ``COMPLETE``, or a non-finite tensor. The message names the file or tensor."""


class CheckpointStore:
    """Saves and finds checkpoints of one training run in ``directory``; keeps the last ``keep``."""

    def __init__(self, directory: str | Path, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self._release_lock: weakref.finalize | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy sent to a worker process (data-parallel training) writes under the lock its
        # parent holds; the lock itself (an open file) stays with the parent.
        return {**self.__dict__, "_release_lock": None}

    def lock(self) -> CheckpointStore:
        """Take the exclusive lock on ``directory`` (created if missing) for as long as this
        store lives or until :meth:`release`; returns the store.

        Raises:
            CheckpointsInUse: another live process (or store) holds it; the message names it.
        """
        if self._release_lock is not None and self._release_lock.alive:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = open(self.directory / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise CheckpointsInUse(
                f"checkpoint folder {self.directory} is in use by {holder}: two runs of the "
                "same training (same starting weights, data and parameters) would overwrite "
                "each other's checkpoints. Wait for that run to finish (this run then resumes "
                "or loads its result), or stop it."
            ) from None
        handle.seek(0)
        handle.truncate()
        started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {started}\n")
        handle.flush()
        self._release_lock = weakref.finalize(self, handle.close)
        return self

    def release(self) -> None:
        """Give the lock up (no-op when not held)."""
        if self._release_lock is not None:
            self._release_lock()
            self._release_lock = None

    def __repr__(self) -> str:
        return f"CheckpointStore({str(self.directory)!r}, keep={self.keep})"

    def subdirectory(self, name: str) -> CheckpointStore:
        """A store for one run inside this one (e.g. keyed by ``state_fingerprint``)."""
        return CheckpointStore(self.directory / name, keep=self.keep)

    def completed(self) -> list[Path]:
        """Checkpoint folders marked complete, oldest first. Their contents are not verified
        here (that reads every file): ``latest``, ``load`` and ``load_latest`` do it."""
        if not self.directory.is_dir():
            return []
        return sorted(
            p for p in self.directory.glob(f"{_PREFIX}*") if p.is_dir() and (p / MARKER).exists()
        )

    def latest(self) -> Path | None:
        """The newest complete checkpoint whose files match the checksums in its ``COMPLETE``,
        with a warning naming the damaged file of each newer one; None when there is none.
        Its tensors are checked only by ``load``."""
        for path in reversed(self.completed()):
            try:
                verify_files(path)
            except DamagedCheckpointError as error:
                logger.warning("checkpoint %s is damaged (%s); skipping it", path, error)
                continue
            return path
        return None

    def save(
        self,
        step: int,
        module: torch.nn.Module,
        state: dict[str, Any],
        weights: dict[str, torch.Tensor] | None = None,
    ) -> Path:
        """Write weights and ``state`` (optimizer, scheduler, history, ...) for ``step``.

        ``weights``: the model's whole state dict when ``module`` cannot give it (FSDP shards,
        gathered by ``creditflow.training.fsdp.full_state_dicts``); ``module`` then only says
        which names are tied to one parameter."""
        path = self.directory / f"{_PREFIX}{step:06d}"
        try:
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
            if weights is None:
                weights_file = _save_weights(module, path)
            else:
                weights_file = _save_gathered_weights(weights, module, path)
            torch.save({"step": step, **state}, path / TRAINER_STATE)
            written = (weights_file, path / TRAINER_STATE)
            # COMPLETE may reach the disk only after what it vouches for.
            for file in written:
                fsync_path(file)
            fsync_path(path)
            marker = {"step": step, "sha256": {file.name: file_sha256(file) for file in written}}
            (path / MARKER).write_text(json.dumps(marker, indent=1))
            fsync_path(path / MARKER)
            fsync_path(path)
            fsync_path(self.directory)
        except (OSError, RuntimeError, SafetensorError) as error:
            raise self._write_failure(path, error) from error
        # Folders past this step are ones this run did not resume from (they were damaged):
        # kept, they would outrank this checkpoint below and at the next resume.
        for later in self.completed():
            if int(later.name.removeprefix(_PREFIX)) > step:
                logger.warning("removing %s: this run resumed before it", later)
                shutil.rmtree(later, ignore_errors=True)
        # Older checkpoints go only now, once this one is complete.
        for old in self.completed()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        logger.info("saved checkpoint %s", path)
        return path

    def _write_failure(self, path: Path, error: BaseException) -> CheckpointWriteError:
        """The error for a save into ``path`` that raised ``error``, after removing the
        half-written folder (never loaded, as it has no COMPLETE; removed to give its space
        back). The free space is measured before that, as the write found it."""
        try:
            free = _size(shutil.disk_usage(self.directory).free)
        except OSError:
            free = "an unknown amount"
        shutil.rmtree(path, ignore_errors=True)
        cause = "the disk is full" if _is_disk_full(error) else "the write failed"
        previous = self.latest()
        kept = (
            f"the previous checkpoint {previous} is intact and running the same command "
            "again resumes from it"
            if previous is not None
            else "there is no earlier checkpoint: running the same command again starts this "
            "training afresh"
        )
        return CheckpointWriteError(
            f"could not write checkpoint {path.name} in {self.directory}: {cause} "
            f"({type(error).__name__}: {error}); {free} free on that file system. The "
            f"half-written {path.name} was removed; {kept}. Fix: free space there, or point "
            "the checkpoint dataset's `filepath` (conf/base/catalog.yml) at a larger disk"
        )

    def load(self, path: Path, module: torch.nn.Module) -> dict[str, Any]:
        """Load weights into ``module`` and return the saved trainer state. Both files are
        read and checked (checksums, structure, finite tensors) before ``module`` is touched,
        so a broken checkpoint raises and leaves the module as it was.

        Raises:
            DamagedCheckpointError: a file differs from its recorded checksum, or a weight or
                optimizer-state tensor holds NaN or inf; the message names which.
        """
        verify_files(path)
        # weights_only: the state is tensors and plain containers (optimizer and scheduler
        # state dicts, RNG states as uint8 tensors, lists of metrics); anything else refuses.
        state = torch.load(path / TRAINER_STATE, weights_only=True)
        # Only the optimizer's state: a pending rollout's tensors may hold -inf on purpose.
        _check_finite(state.get("optimizer"), path / TRAINER_STATE, "optimizer")
        device = str(next(module.parameters()).device)
        if is_lora_model(module):
            # Read whole (a truncated file raises), keys checked, then copied in.
            weights = load_file(path / ADAPTER_WEIGHTS, device=device)
            _check_finite(weights, path / ADAPTER_WEIGHTS)
            load_adapter_state_dict(module, weights)
        else:
            weights_file = path / MODEL_WEIGHTS
            # Reads and checks the whole file (a truncated one raises here).
            _check_finite(load_file(weights_file), weights_file)
            load_model(module, str(weights_file), device=device)
        logger.info("resumed from checkpoint %s (step %d)", path, state["step"])
        return state

    def load_latest(self, module: torch.nn.Module) -> dict[str, Any] | None:
        """The newest complete checkpoint that loads (weights into ``module``, the trainer
        state returned), falling back to older ones with a warning for each that fails; None
        when there is none (the run starts afresh)."""
        for path in reversed(self.completed()):
            try:
                return self.load(path, module)
            except Exception as error:  # noqa: BLE001 - any unreadable file: try the older one
                logger.warning(
                    "checkpoint %s is marked complete but does not load (%s: %s); "
                    "trying the one before it",
                    path,
                    type(error).__name__,
                    error,
                )
        if self.completed():
            logger.warning("no checkpoint in %s loads: starting afresh", self.directory)
        return None


def recorded_checksums(path: Path) -> dict[str, str] | None:
    """``{file name: sha256 hex}`` from checkpoint folder ``path``'s ``COMPLETE``; None for a
    marker holding only the step number, which records none.

    Raises:
        DamagedCheckpointError: ``COMPLETE`` is neither of those (bytes lost or changed).
    """
    marker = path / MARKER
    try:
        recorded = json.loads(marker.read_bytes())
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError both
        raise DamagedCheckpointError(f"{marker} is not a checkpoint marker ({error})") from None
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        return None
    checksums = recorded.get("sha256") if isinstance(recorded, dict) else None
    if not isinstance(checksums, dict) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in checksums.items()
    ):
        raise DamagedCheckpointError(
            f"{marker} is not a checkpoint marker (no {{file name: sha256}} under 'sha256')"
        )
    return checksums


def verify_files(path: Path) -> None:
    """Check every file that checkpoint folder ``path``'s ``COMPLETE`` records against its
    SHA-256.

    Raises:
        DamagedCheckpointError: naming the first file that is missing or differs.
    """
    checksums = recorded_checksums(path)
    if checksums is None:
        logger.debug("checkpoint %s records no checksums: its files are not verified", path)
        return
    for name, expected in sorted(checksums.items()):
        file = path / name
        if not file.is_file():
            raise DamagedCheckpointError(f"{file} is missing; {MARKER} records its checksum")
        found = file_sha256(file)
        if found != expected:
            raise DamagedCheckpointError(
                f"{file} is damaged: its SHA-256 is {found}, {MARKER} recorded {expected}"
            )


def _check_finite(value: Any, file: Path, name: str = "") -> None:
    """Raise ``DamagedCheckpointError`` naming the first floating-point tensor in ``value``
    (a tensor, or dicts / lists / tuples of them, as read from ``file``) that holds NaN or
    inf; ``name`` is the dotted key path to ``value``."""
    bad = first_non_finite_parameter(_named_tensors(value, name))
    if bad is not None:
        raise DamagedCheckpointError(f"{file}: tensor {bad!r} holds NaN or inf")


def _named_tensors(value: Any, name: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(dotted key path, tensor)`` of every tensor in nested dicts / lists / tuples."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, dict | list | tuple):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            yield from _named_tensors(item, f"{name}.{key}" if name else str(key))


def _save_weights(module: torch.nn.Module, path: Path) -> Path:
    """Write ``module``'s weights into checkpoint folder ``path``; returns the file. A LoRA
    model's are its adapter's only: its base never changes and ``run_store``'s fingerprint
    covers it, so a resumed run has the same base."""
    if is_lora_model(module):
        weights = path / ADAPTER_WEIGHTS
        save_file(adapter_state_dict(module), str(weights))
    else:
        weights = path / MODEL_WEIGHTS
        # save_model handles tied weights (shared tensors) that save_file refuses.
        save_model(module, str(weights))
    return weights


def tied_aliases(module: torch.nn.Module) -> dict[str, str]:
    """``{alias: kept name}`` for each parameter of ``module`` registered under several names
    (a tied head: ``lm_head.weight`` -> ``model.embed_tokens.weight``)."""
    first_name: dict[int, str] = {}
    aliases = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if id(parameter) in first_name:
            aliases[name] = first_name[id(parameter)]
        else:
            first_name[id(parameter)] = name
    return aliases


def _save_gathered_weights(
    weights: dict[str, torch.Tensor], module: torch.nn.Module, path: Path
) -> Path:
    """``weights`` (a whole state dict of ``module``) into checkpoint folder ``path`` as
    ``save_model`` writes them: one name per parameter, the dropped aliases in the metadata,
    so ``load_model`` and ``from_pretrained`` tie them again."""
    aliases = tied_aliases(module)
    kept = {name: t.contiguous() for name, t in weights.items() if name not in aliases}
    save_file(kept, str(path / MODEL_WEIGHTS), metadata={"format": "pt", **aliases})
    return path / MODEL_WEIGHTS


def _is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
        return True
    return any(text in str(error) for text in _DISK_FULL_TEXTS)


def _size(n_bytes: int) -> str:
    """``1.5 GiB (1,610,612,736 bytes)``."""
    value, unit = float(n_bytes), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    exact = f"{n_bytes:,} bytes"
    return exact if unit == "bytes" else f"{value:.1f} {unit} ({exact})"


def fsync_path(path: Path) -> None:
    """Flush a file's or a folder's contents to the disk (folders: their entries)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def state_fingerprint(module: torch.nn.Module, *extra: object) -> str:
    """A short hash of a module's weights and any JSON-able ``extra`` (config, prompts).

    Checkpoints live under ``<store>/<fingerprint>/`` so that a run resumes only a run with
    the same starting weights, data and parameters, and otherwise starts afresh.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(
            tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        )
    # Which weights train is part of the run (a frozen vision encoder, LoRA's frozen base);
    # added only when some are frozen, so fully trainable runs keep their fingerprints.
    frozen = [name for name, p in module.named_parameters() if not p.requires_grad]
    if frozen:
        digest.update(json.dumps({"frozen": frozen}).encode())
    digest.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def tokenizer_digest(tokenizer: Any) -> str:
    """A short sha256 of a tokenizer's vocabulary, added tokens and chat template: two
    tokenizers of the same size but other ids must not share a checkpoint."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return content_digest(f"{vocab}\x00{getattr(tokenizer, 'chat_template', None)}")


def content_digest(value: torch.Tensor | bytes | str) -> str:
    """A short sha256 of a tensor's bytes (with its shape and dtype), or of bytes / a string,
    to key a run by data that ``state_fingerprint``'s JSON cannot hold."""
    digest = hashlib.sha256()
    if isinstance(value, torch.Tensor):
        digest.update(f"{tuple(value.shape)}{value.dtype}".encode())
        value = value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    digest.update(value if isinstance(value, bytes) else value.encode())
    return digest.hexdigest()[:16]


def run_store(
    checkpoints: CheckpointStore | None, module: torch.nn.Module, *extra: object
) -> CheckpointStore | None:
    """The subdirectory of ``checkpoints`` for one run, keyed by ``state_fingerprint(module,
    *extra)`` (starting weights, config, data) and the intra-op thread count (float reductions
    differ with it, so a run at 2 threads must not resume one trained at 1): a re-run resumes
    only the very same run. The store comes locked (:meth:`CheckpointStore.lock`): it raises
    ``CheckpointsInUse`` while another run trains the same thing."""
    if checkpoints is None:
        return None
    store = checkpoints.subdirectory(
        state_fingerprint(module, *extra, {"torch_threads": torch.get_num_threads()})
    )
    logger.info("checkpoints of this run in %s", store.directory)
    return store.lock()
