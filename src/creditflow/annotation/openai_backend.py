"""VLM annotator over an OpenAI-compatible ``/v1/chat/completions`` endpoint (SPEC 3.1).

The paper annotates with Qwen2.5-VL-32B; any server speaking the OpenAI chat API (vLLM, SGLang,
TGI, llama.cpp) can play that role. Each item is one request: the prompt (title, category and
the schema) as text plus the cover as a base64 PNG data URL. Output is parsed with
:func:`creditflow.annotation.schema.parse_annotation`.

Failure handling: a request that times out, answers 429 / 5xx, or whose reply holds no valid
annotation is retried up to ``max_retries`` times, sleeping ``backoff_s * 2**k`` before retry
``k + 1`` (no jitter, so a run is reproducible); other HTTP errors (400, 401, 404) fail at once,
since repeating them cannot help. An item that never succeeds gets ``status == "failed"`` with
its last raw reply and the error, and no scores: nothing is invented and nothing raises.

Secrets (issue 16): everything the server sends back (error bodies, replies) passes through
:func:`creditflow.redaction.scrub` before it is logged, cached or stored, so a 401 body that
echoes the key leaves ``[REDACTED]`` in ``item_annotations``. The key itself comes from Kedro
credentials or ``OPENAI_API_KEY`` (:mod:`creditflow.annotation.credentials`), never parameters.

Successful annotations are cached in ``cache_dir``, one JSON file per
``sha256(image bytes, title, prompt, model)``, so a rerun only requests what is missing;
failures are not cached, so a rerun retries them.

Only the standard library is used for HTTP (``urllib``): the project pins no HTTP client.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from creditflow.annotation.schema import (
    SCHEMA_DESCRIPTION,
    Annotation,
    AnnotationParseError,
    annotations_frame,
    failed_row,
    ok_row,
    parse_annotation,
    visible_items,
)
from creditflow.redaction import scrub

logger = logging.getLogger(__name__)

DEFAULT_PROMPT_TEMPLATE = (
    "You rate the viewing experience of a short video from its cover image and title.\n"
    "Category: {category}\n"
    "Title: {title}\n"
    "Look at the cover image: judge its sharpness, exposure and noise; judge whether the "
    "title says concretely what the video shows and whether the item stays on its category.\n"
    "{schema}"
)
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_CACHE_VERSION = 1  # bump when the cached record's layout changes


@dataclass(frozen=True)
class _Outcome:
    raw_text: str | None
    annotation: Annotation | None
    attempts: int
    error: str | None


class _RetryableError(Exception):
    """A failure worth another attempt: timeout, connection error, 429/5xx, bad reply."""


class _FatalError(Exception):
    """A failure that another attempt cannot fix (HTTP 400, 401, 404 ...)."""


class OpenAIAnnotator:
    """Annotate items by asking a served VLM for the schema's JSON.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8000`` or ``http://host:8000/v1``;
            requests go to ``<root>/v1/chat/completions`` (``/v1`` is added when missing).
        model: model name sent in each request (and part of the cache key).
        api_key: sent as ``Authorization: Bearer <api_key>``; no header when None or empty
            (local servers). Pipelines pass it from Kedro credentials, not parameters.
        max_concurrency: requests in flight at once (>= 1).
        timeout_s: per-request timeout in seconds (> 0).
        max_retries: retries after the first attempt (>= 0); an item makes at most
            ``max_retries + 1`` requests.
        backoff_s: sleep before the first retry, doubled before each further one (>= 0).
        cache_dir: folder of cached annotations (created on demand); no cache when None.
        prompt_template: text with the placeholders ``{title}``, ``{category}`` and ``{schema}``
            (the schema instructions); every one must be a known placeholder.
        max_tokens: completion budget per request.
        progress: show a progress bar over items (on by default; a served model is slow).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        max_concurrency: int = 4,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        cache_dir: str | os.PathLike | None = None,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        max_tokens: int = 512,
        progress: bool = True,
    ) -> None:
        if not base_url or not model:
            raise ValueError("base_url and model must be non-empty")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s <= 0 or backoff_s < 0 or max_retries < 0 or max_tokens < 1:
            raise ValueError(
                "need timeout_s > 0, backoff_s >= 0, max_retries >= 0 and max_tokens >= 1, got "
                f"{timeout_s}, {backoff_s}, {max_retries}, {max_tokens}"
            )
        try:
            prompt_template.format(title="", category="", schema="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                "prompt_template may only use the placeholders {title}, {category} and {schema} "
                f"(double other braces): {exc!r}"
            ) from exc
        root = base_url.rstrip("/")
        self.url = (
            f"{root}/chat/completions" if root.endswith("/v1") else f"{root}/v1/chat/completions"
        )
        self.model = model
        self.api_key = api_key
        self.max_concurrency = max_concurrency
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.prompt_template = prompt_template
        self.max_tokens = max_tokens
        self.progress = progress
        self.sleep: Callable[[float], None] = time.sleep  # replaceable in tests

    def annotate(self, items: pd.DataFrame) -> pd.DataFrame:
        """Annotate every item, reading the cache first.

        Args:
            items: frame with at least ``ITEM_COLUMNS``; other columns are dropped unread.

        Returns:
            One row per item, in input order, with ``ANNOTATION_COLUMNS``. ``attempts`` counts
            the requests made in this call (0 for an item served from the cache).
        """
        visible = visible_items(items)
        records = visible.to_dict("records")
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            done = pool.map(self._annotate_item_safely, records)
            outcomes = list(
                tqdm(done, total=len(records), desc="annotate", disable=not self.progress)
            )
        rows = []
        for record, outcome in zip(records, outcomes, strict=True):
            if outcome.annotation is not None:
                rows.append(
                    ok_row(
                        record["item_id"], outcome.annotation, outcome.raw_text, outcome.attempts
                    )
                )
            else:
                rows.append(
                    failed_row(record["item_id"], outcome.raw_text, outcome.attempts, outcome.error)
                )
        n_failed = sum(o.annotation is None for o in outcomes)
        n_cached = sum(o.annotation is not None and o.attempts == 0 for o in outcomes)
        logger.info(
            "annotated %d items with %s: %d from cache, %d failed",
            len(rows),
            self.model,
            n_cached,
            n_failed,
        )
        return annotations_frame(rows)

    def prompt(self, title: str, category: str) -> str:
        """The text part of an item's request."""
        return self.prompt_template.format(
            title=title, category=category, schema=SCHEMA_DESCRIPTION
        )

    def cache_key(self, image_png: bytes, title: str, prompt: str) -> str:
        """sha256 over the image bytes, title, prompt and model, each length-prefixed."""
        digest = hashlib.sha256()
        for part in (image_png, title.encode(), prompt.encode(), self.model.encode()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        return digest.hexdigest()

    def _annotate_item_safely(self, item: dict[str, Any]) -> _Outcome:
        # One broken item (an unexpected error, a full disk for the cache) must not sink a run
        # of thousands: it becomes a failed row carrying the error.
        try:
            return self._annotate_item(item)
        except Exception as exc:
            logger.error("item %s: unexpected error: %s", item["item_id"], self._scrub(repr(exc)))
            return _Outcome(None, None, 0, self._scrub(f"unexpected error: {exc!r}"))

    def _annotate_item(self, item: dict[str, Any]) -> _Outcome:
        prompt = self.prompt(item["title"], item["category"])
        key = self.cache_key(item["image_png"], item["title"], prompt)
        cached = self._read_cache(key)
        if cached is not None:
            return _Outcome(cached, parse_annotation(cached), attempts=0, error=None)
        body = self._request_body(prompt, item["image_png"])
        raw_text, error = None, None
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                raw_text = self._post(body)
                annotation = parse_annotation(raw_text)
            except AnnotationParseError as exc:
                error = f"unparsable output: {exc}"
            except _RetryableError as exc:
                error = str(exc)
            except _FatalError as exc:
                return _Outcome(raw_text, None, attempt + 1, str(exc))
            else:
                self._write_cache(key, raw_text)
                return _Outcome(raw_text, annotation, attempt + 1, None)
            logger.debug("item %s attempt %d failed: %s", item["item_id"], attempt + 1, error)
        logger.warning(
            "item %s failed after %d attempts: %s", item["item_id"], self.max_retries + 1, error
        )
        return _Outcome(raw_text, None, self.max_retries + 1, error)

    def _request_body(self, prompt: str, image_png: bytes) -> bytes:
        data_url = "data:image/png;base64," + base64.b64encode(image_png).decode("ascii")
        message = {
            "role": "user",
            "content": [
                {"type": "text", "text": prompt},
                {"type": "image_url", "image_url": {"url": data_url}},
            ],
        }
        body = {
            "model": self.model,
            "messages": [message],
            "temperature": 0.0,  # annotations should not depend on sampling luck
            "max_tokens": self.max_tokens,
        }
        return json.dumps(body).encode()

    def _post(self, body: bytes) -> str:
        """One request; returns the reply's message content or raises a classified error."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            # Scrub before cutting: a cut through the key would leave half of it unrecognised.
            detail = self._scrub(exc.read(4096).decode(errors="replace"))[:200]
            message = f"HTTP {exc.code} from {self.url}: {detail}"
            raise (_RetryableError if exc.code in RETRYABLE_STATUS else _FatalError)(
                message
            ) from exc
        except TimeoutError as exc:  # socket.timeout is its alias
            raise _RetryableError(f"timed out after {self.timeout_s:g} s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise _RetryableError(f"timed out after {self.timeout_s:g} s") from exc
            raise _RetryableError(f"connection failed: {exc.reason}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _RetryableError(f"connection failed: {exc}") from exc
        try:
            content = json.loads(payload)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            preview = self._scrub(repr(payload[:4096]))[:200]
            raise _RetryableError(f"reply is not a chat completion: {preview}") from exc
        if not isinstance(content, str):
            raise _RetryableError(f"reply content is not text: {self._scrub(repr(content)):.200}")
        return self._scrub(content)

    def _scrub(self, text: str) -> str:
        return scrub(text, [self.api_key])

    def _read_cache(self, key: str) -> str | None:
        if self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key}.json"
        try:
            record = json.loads(path.read_text())
            raw_text = record["raw_text"]
            parse_annotation(raw_text)  # a stale or corrupt entry is re-requested
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring unreadable cache entry %s: %s", path, exc)
            return None
        return raw_text

    def _write_cache(self, key: str, raw_text: str) -> None:
        if self.cache_dir is None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        path = self.cache_dir / f"{key}.json"
        record = {"version": _CACHE_VERSION, "model": self.model, "raw_text": raw_text}
        # Write then rename: a crash mid-write never leaves a truncated entry behind.
        tmp = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record, ensure_ascii=False))
        os.replace(tmp, path)
