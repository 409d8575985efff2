"""Files that appear whole or not at all.

A report or manifest written in place is truncated when the disk fills or the process dies
mid-write, and a versioned dataset's newest version is then that truncated file. Here the
bytes go to a temporary name in the target's folder (same file system, so the rename is
atomic), are fsynced, and only then replace the target with ``os.replace``; on any error the
temporary is removed and the error propagates, leaving the previous file as it was.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

# The write modes, each with the exclusive-create mode the temporary is opened in (``x``: a
# name that already exists is never overwritten, and the file gets the umask's permissions,
# as an ordinary ``open(path, "w")`` gives).
_CREATE_MODES = {"w": "x", "wt": "xt", "wb": "xb"}


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **open_args: Any) -> Iterator[IO]:
    """A file to write ``path`` through: ``path`` is replaced when the block ends without an
    error, and left untouched (no temporary either) when it raises.

    Args:
        path: the target; its folder must exist.
        mode: ``"w"`` / ``"wt"`` (text) or ``"wb"`` (bytes).
        open_args: the rest of :func:`open`'s keywords (``encoding``, ``newline`` ...).

    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "report.txt"
    >>> with atomic_open(target, encoding="utf-8") as handle:
    ...     _ = handle.write("whole")
    >>> target.read_text(encoding="utf-8")
    'whole'
    """
    if mode not in _CREATE_MODES:
        raise ValueError(
            f"atomic_open writes whole files: mode {mode!r}; valid: {list(_CREATE_MODES)}"
        )
    target = Path(path)
    # A dot name: a folder listing or a glob for the target's versions does not match it.
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, _CREATE_MODES[mode], **open_args) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """``Path(path).write_text(text)``, whole or not at all (:func:`atomic_open`)."""
    with atomic_open(path, "w", encoding=encoding) as handle:
        handle.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """``Path(path).write_bytes(data)``, whole or not at all (:func:`atomic_open`)."""
    with atomic_open(path, "wb") as handle:
        handle.write(data)
