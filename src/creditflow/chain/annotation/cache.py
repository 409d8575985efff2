"""The annotators' on-disk cache: one JSON file per item and request, so a rerun (or a run
resumed after a crash) only annotates what is missing.

A key is ``sha256`` over length-prefixed parts that decide the answer: the cover bytes, the
title, the prompt, the model and the decoding settings (each backend says which,
:meth:`AnnotationCache.key`). Only valid annotations are stored, so failures are asked again;
an entry that no longer parses (an older schema, a truncated file) is ignored and asked again.
Writes go to a temporary file renamed into place, so a crash never leaves half an entry and
concurrent writers of one key leave one whole entry.

The cache is on by default (:data:`DEFAULT_CACHE_DIR`, relative to the working directory: the
project root under ``kedro run``); ``cache_dir: null`` switches it off. It is not a Kedro
dataset: it is the annotators' memo of requests already paid for (a served 32B VLM takes
seconds an item), not an artefact of a run, like the resumable checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from creditflow.chain.annotation.schema import parse_annotation
from creditflow.io_atomic import atomic_write_text

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path("data/02_intermediate/annotation_cache")
CACHE_VERSION = 2  # 2: keys cover the decoding settings (structured output, token budget)


class AnnotationCache:
    """Valid annotations under ``root``, one ``<key>.json`` each (module docstring)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    @staticmethod
    def key(*parts: bytes | str) -> str:
        """sha256 over ``parts``, each length-prefixed (so ``("ab", "c") != ("a", "bc")``).

        >>> AnnotationCache.key("ab", "c") == AnnotationCache.key("a", "bc")
        False
        """
        digest = hashlib.sha256()
        for part in parts:
            data = part.encode() if isinstance(part, str) else bytes(part)
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
        return digest.hexdigest()

    def get(self, key: str) -> str | None:
        """The cached raw text of ``key``, or None when missing, unreadable or no longer valid."""
        path = self.root / f"{key}.json"
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            raw_text = record["raw_text"]
            parse_annotation(raw_text)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring unreadable cache entry %s: %s", path, exc)
            return None
        return raw_text

    def put(self, key: str, raw_text: str, model: str) -> None:
        """Store a valid annotation's raw text (``model`` is kept for a reader of the file)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{key}.json"
        record = {"version": CACHE_VERSION, "model": model, "raw_text": raw_text}
        atomic_write_text(path, json.dumps(record, ensure_ascii=False))


def open_cache(cache_dir: str | os.PathLike | None) -> AnnotationCache | None:
    """The cache at ``cache_dir``; None (no cache) when ``cache_dir`` is None."""
    return None if cache_dir is None else AnnotationCache(cache_dir)
