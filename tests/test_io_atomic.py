"""creditflow.io_atomic: a file written whole or not at all."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from creditflow.io_atomic import atomic_open, atomic_write_bytes, atomic_write_text
from tests.full_disk import fill_disk_halfway


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("old", encoding="utf-8")
    atomic_write_text(target, "<p>new</p>")
    assert target.read_text(encoding="utf-8") == "<p>new</p>"
    atomic_write_bytes(target, b"\x89PNG")
    assert target.read_bytes() == b"\x89PNG"
    assert os.listdir(tmp_path) == ["report.html"]


def test_a_new_file_gets_the_permissions_of_an_ordinary_write(tmp_path: Path) -> None:
    plain, atomic = tmp_path / "plain.txt", tmp_path / "atomic.txt"
    plain.write_text("x")
    atomic_write_text(atomic, "x")
    assert stat.S_IMODE(atomic.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_a_full_disk_halfway_keeps_the_old_file_and_raises_the_disk_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "manifest.json"
    target.write_text('{"status": "completed"}\n', encoding="utf-8")
    opened = fill_disk_halfway(monkeypatch)
    with pytest.raises(OSError) as error:
        atomic_write_text(target, '{"status": "failed", "error": "' + "x" * 1000 + '"}\n')
    assert error.value.errno == errno.ENOSPC
    assert target.read_text(encoding="utf-8") == '{"status": "completed"}\n'
    assert len(opened) == 1 and Path(opened[0]).parent == tmp_path  # renamed within the folder
    assert os.listdir(tmp_path) == ["manifest.json"]  # the half-written temporary is gone


def test_an_error_inside_the_block_is_the_one_raised_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    target = tmp_path / "table.csv"
    with pytest.raises(KeyError, match="column"):
        with atomic_open(target, "w") as handle:
            handle.write("a,b\n")
            raise KeyError("column")
    assert os.listdir(tmp_path) == []


def test_only_whole_file_write_modes_are_taken(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"mode 'a'; valid: \['w', 'wt', 'wb'\]"):
        with atomic_open(tmp_path / "log.txt", "a"):
            pass
