"""Resumable training checkpoints: weights in safetensors, trainer state beside them.

Layout: ``<directory>/step-000010/{model.safetensors, trainer_state.pt, COMPLETE}``. A
checkpoint counts only once ``COMPLETE`` is written (last), so a run killed mid-save resumes
from the previous one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

logger = logging.getLogger(__name__)

_PREFIX = "step-"


class CheckpointStore:
    """Saves and finds checkpoints of one training run in ``directory``; keeps the last ``keep``."""

    def __init__(self, directory: str | Path, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep

    def __repr__(self) -> str:
        return f"CheckpointStore({str(self.directory)!r}, keep={self.keep})"

    def subdirectory(self, name: str) -> CheckpointStore:
        """A store for one run inside this one (e.g. keyed by ``state_fingerprint``)."""
        return CheckpointStore(self.directory / name, keep=self.keep)

    def completed(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(
            p
            for p in self.directory.glob(f"{_PREFIX}*")
            if p.is_dir() and (p / "COMPLETE").exists()
        )

    def latest(self) -> Path | None:
        done = self.completed()
        return done[-1] if done else None

    def save(self, step: int, module: torch.nn.Module, state: dict[str, Any]) -> Path:
        """Write weights and ``state`` (optimizer, scheduler, history, ...) for ``step``."""
        path = self.directory / f"{_PREFIX}{step:06d}"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        # save_model handles tied weights (shared tensors) that save_file refuses.
        save_model(module, str(path / "model.safetensors"))
        torch.save({"step": step, **state}, path / "trainer_state.pt")
        (path / "COMPLETE").write_text(str(step))
        for old in self.completed()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        logger.info("saved checkpoint %s", path)
        return path

    def load(self, path: Path, module: torch.nn.Module) -> dict[str, Any]:
        """Load weights into ``module`` and return the saved trainer state."""
        load_model(
            module, str(path / "model.safetensors"), device=str(next(module.parameters()).device)
        )
        # Our own file (optimizer/scheduler state dicts, python lists of metrics), not untrusted input.
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        logger.info("resumed from checkpoint %s (step %d)", path, state["step"])
        return state


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
    only the very same run."""
    if checkpoints is None:
        return None
    store = checkpoints.subdirectory(
        state_fingerprint(module, *extra, {"torch_threads": torch.get_num_threads()})
    )
    logger.info("checkpoints of this run in %s", store.directory)
    return store
