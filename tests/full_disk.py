"""A disk that fills halfway through a write, for the tests of files written whole or not at all
(creditflow.io_atomic)."""

from __future__ import annotations

import builtins
import errno
import os
from typing import Any

import pytest

from creditflow import io_atomic


class _HalfWriter:
    """A file whose ``write`` stores the first half of what it is given, then fails as a full
    disk does (the half stays on disk, as with a real ENOSPC)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def write(self, data: Any) -> int:
        self._handle.write(data[: len(data) // 2])
        self._handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _HalfWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


def fill_disk_halfway(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every file :mod:`creditflow.io_atomic` opens fail halfway through its first write;
    returns the list of the paths it opened (the temporaries)."""
    opened: list[str] = []

    def half_open(path: Any, mode: str = "r", **kwargs: Any) -> _HalfWriter:
        opened.append(str(path))
        return _HalfWriter(builtins.open(path, mode, **kwargs))

    monkeypatch.setattr(io_atomic, "open", half_open, raising=False)
    return opened
