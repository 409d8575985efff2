"""Hostile image files for the loaders' image checks, made cheaply."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def write_one_colour_png(path: Path, width: int, height: int) -> Path:
    """A valid black 1-bit PNG of ``width`` x ``height``, written row by row: a 15000 x 15000
    one (225 M pixels, gigabytes once decoded) takes 28 MB of zeros to compress and about
    30 KB on disk, and no pixel buffer is ever allocated."""
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte "none", then the packed bits
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1 bit, grey, no interlace
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", idat)
        + _chunk(b"IEND", b"")
    )
    return path


def write_truncated_jpeg(path: Path) -> Path:
    """A JPEG cut off after 60 % of its bytes, as an interrupted download leaves it."""
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=90)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 6 // 10])
    return path


@pytest.fixture
def hostile_image(tmp_path) -> Callable[[str], Path]:
    """``kind`` -> the path of a new hostile image: ``truncated_jpeg``, ``bomb`` (15000 x 15000,
    past twice Pillow's bound: its DecompressionBombError) or ``bomb_warning`` (10000 x 10000,
    between the bound and twice it: only a DecompressionBombWarning from Pillow)."""

    def make(kind: str) -> Path:
        if kind == "truncated_jpeg":
            return write_truncated_jpeg(tmp_path / "cut.jpg")
        sizes = {"bomb": 15_000, "bomb_warning": 10_000}
        return write_one_colour_png(tmp_path / f"{kind}.png", sizes[kind], sizes[kind])

    return make
