"""CPU thread count for a block of training or evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from creditflow.errors import ConfigError


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op CPU threads (``None``: leave torch's setting), then
    restore the previous count. A tiny model's matmuls are far below what threading pays
    off for; on a shared CPU the extra threads spin and a step takes 10x longer."""
    if n is None:
        yield
        return
    if n < 1:
        raise ConfigError(f"torch_threads must be >= 1 or null, got {n}")
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
