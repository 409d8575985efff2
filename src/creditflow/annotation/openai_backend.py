"""VLM annotator over an OpenAI-compatible chat-completions endpoint (SPEC 3.1).

The paper annotates with Qwen2.5-VL-32B; any server speaking the OpenAI chat API (vLLM, SGLang,
TGI, llama.cpp) can play that role, through the official ``openai`` client. Each item is one
request: the prompt (title, category and the schema) as text plus the cover as a base64 PNG
data URL, and, unless ``structured_output`` is off, ``response_format`` of type
``json_schema`` built from the annotation schema
(:func:`creditflow.annotation.schema.annotation_json_schema`), which vLLM and SGLang enforce
with guided decoding, so replies are valid JSON of the schema's keys. Output is parsed with
:func:`creditflow.annotation.schema.parse_annotation` either way.

Failure handling: the client retries a request that times out, cannot connect, or answers
408 / 409 / 429 / 5xx up to ``max_retries`` times, waiting what the server's ``Retry-After``
(or ``retry-after-ms``) header asks when it says (up to 2 minutes; a longer wait is not
retried), else an exponential backoff from 0.5 s (capped at 8 s, with jitter); other HTTP
errors (400, 401, 404) fail at once, since repeating them cannot help. A reply that holds no
valid annotation is asked again up to ``reply_retries`` times. An item that never succeeds
gets ``status == "failed"`` with its last raw reply and the error, and no scores: nothing is
invented and nothing raises. ``attempts`` counts the HTTP requests the item made.

Secrets (issue 16): everything the server sends back (error bodies, replies) passes through
:func:`creditflow.redaction.scrub` before it is logged, cached or stored, so a 401 body that
echoes the key leaves ``[REDACTED]`` in ``item_annotations``. The key itself comes from Kedro
credentials or ``OPENAI_API_KEY`` (:mod:`creditflow.annotation.credentials`), never parameters;
without one, requests carry no ``Authorization`` header.

Successful annotations are cached on disk (:mod:`creditflow.annotation.cache`, on by default),
keyed by the image bytes, title, prompt, model and request settings, so a rerun only requests
what is missing; failures are not cached, so a rerun retries them.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import openai
import pandas as pd
from tqdm.auto import tqdm

from creditflow.annotation.cache import DEFAULT_CACHE_DIR, AnnotationCache, open_cache
from creditflow.annotation.schema import (
    SCHEMA_DESCRIPTION,
    Annotation,
    annotation_json_schema,
    annotations_frame,
    failed_row,
    item_query,
    ok_row,
    parse_annotation,
    query_prompt,
    visible_items,
)
from creditflow.errors import AnnotationParseError
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
SCHEMA_NAME = "item_annotation"  # the json_schema's name in the request
# The client needs some key; without one, each request omits the Authorization header.
_NO_KEY = "no-key"


@dataclass(frozen=True)
class _Outcome:
    raw_text: str | None
    annotation: Annotation | None
    attempts: int
    error: str | None


class _BadReply(Exception):
    """A reply worth asking again: not a chat completion, or no valid annotation in it."""


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
        max_retries: the client's retries of one request after a timeout, a connection error
            or HTTP 408 / 409 / 429 / 5xx (>= 0), honouring ``Retry-After``.
        reply_retries: requests again after a reply holding no valid annotation (>= 0).
        cache_dir: folder of cached annotations (created on demand); None switches the cache
            off.
        prompt_template: text with the placeholders ``{title}``, ``{category}`` and ``{schema}``
            (the schema instructions); every one must be a known placeholder.
        max_tokens: completion budget per request.
        structured_output: send ``response_format`` ``json_schema`` (the annotation schema,
            strict); off for a server that rejects it.
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
        reply_retries: int = 1,
        cache_dir: str | os.PathLike | None = DEFAULT_CACHE_DIR,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        max_tokens: int = 512,
        structured_output: bool = True,
        progress: bool = True,
    ) -> None:
        if not base_url or not model:
            raise ValueError("base_url and model must be non-empty")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s <= 0 or max_retries < 0 or reply_retries < 0 or max_tokens < 1:
            raise ValueError(
                "need timeout_s > 0, max_retries >= 0, reply_retries >= 0 and max_tokens >= 1, "
                f"got {timeout_s}, {max_retries}, {reply_retries}, {max_tokens}"
            )
        try:
            prompt_template.format(title="", category="", schema="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                "prompt_template may only use the placeholders {title}, {category} and {schema} "
                f"(double other braces): {exc!r}"
            ) from exc
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else f"{root}/v1"
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.api_key = api_key or None
        self.max_concurrency = max_concurrency
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.reply_retries = reply_retries
        self.cache = open_cache(cache_dir)
        self.prompt_template = prompt_template
        self.max_tokens = max_tokens
        self.structured_output = structured_output
        self.progress = progress
        self._requests = threading.local()  # HTTP requests of the item this thread annotates
        self._client: openai.OpenAI | None = None

    def annotate(self, items: pd.DataFrame) -> pd.DataFrame:
        """Annotate every item, reading the cache first.

        Args:
            items: frame with at least ``ITEM_COLUMNS``, and optionally ``QUERY_COLUMN`` (each
                row then judged for its query, ``schema.QUERY_PROMPT``); other columns are
                dropped unread.

        Returns:
            One row per item, in input order, with ``ANNOTATION_COLUMNS`` (and the query). ``attempts`` counts
            the HTTP requests made in this call (0 for an item served from the cache).
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
            item_id, query = record["item_id"], item_query(record)
            if outcome.annotation is not None:
                rows.append(
                    ok_row(item_id, outcome.annotation, outcome.raw_text, outcome.attempts, query)
                )
            else:
                rows.append(
                    failed_row(item_id, outcome.raw_text, outcome.attempts, outcome.error, query)
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

    def prompt(self, title: str, category: str, query: str | None = None) -> str:
        """The text part of an item's request (judged for ``query`` when given)."""
        text = self.prompt_template.format(
            title=title, category=category, schema=SCHEMA_DESCRIPTION
        )
        return query_prompt(text, query)

    def cache_key(self, image_png: bytes, title: str, prompt: str) -> str:
        """The cache key of an item's request: image, title, prompt, model and the settings
        that change the answer (structured output, token budget)."""
        settings = json.dumps(
            {"structured_output": self.structured_output, "max_tokens": self.max_tokens}
        )
        return AnnotationCache.key(image_png, title, prompt, self.model, settings)

    def response_format(self) -> dict[str, Any] | None:
        """The request's ``response_format``: the annotation's JSON schema, or None (off)."""
        if not self.structured_output:
            return None
        schema = {"name": SCHEMA_NAME, "schema": annotation_json_schema(), "strict": True}
        return {"type": "json_schema", "json_schema": schema}

    # ------------------------------------------------------------------ internals
    @property
    def client(self) -> openai.OpenAI:
        """The ``openai`` client, built on first use (one for all threads: it is thread-safe)."""
        if self._client is None:
            http_client = openai.DefaultHttpxClient(event_hooks={"request": [self._count_request]})
            self._client = openai.OpenAI(
                base_url=self.base_url,
                api_key=self.api_key or _NO_KEY,
                timeout=self.timeout_s,
                max_retries=self.max_retries,
                http_client=http_client,
            )
        return self._client

    def _count_request(self, request: Any) -> None:
        # Called in the sending thread (the client is synchronous), so a thread-local count is
        # the number of requests of the item that thread annotates, retries included.
        self._requests.count = getattr(self._requests, "count", 0) + 1

    def _annotate_item_safely(self, item: dict[str, Any]) -> _Outcome:
        # One broken item (an unexpected error, a full disk for the cache) must not sink a run
        # of thousands: it becomes a failed row carrying the error.
        self._requests.count = 0
        try:
            return self._annotate_item(item)
        except Exception as exc:
            logger.error("item %s: unexpected error: %s", item["item_id"], self._scrub(repr(exc)))
            attempts = self._requests.count
            return _Outcome(None, None, attempts, self._scrub(f"unexpected error: {exc!r}"))

    def _annotate_item(self, item: dict[str, Any]) -> _Outcome:
        prompt = self.prompt(item["title"], item["category"], item_query(item))
        key = self.cache_key(item["image_png"], item["title"], prompt)
        cached = self.cache.get(key) if self.cache is not None else None
        if cached is not None:
            return _Outcome(cached, parse_annotation(cached), attempts=0, error=None)
        messages = self._messages(prompt, item["image_png"])
        raw_text, error = None, None
        for _ in range(self.reply_retries + 1):
            try:
                raw_text = self._ask(messages)
                annotation = parse_annotation(raw_text)
            except AnnotationParseError as exc:
                error = f"unparsable output: {exc}"
            except _BadReply as exc:
                error = str(exc)
            except openai.APIError as exc:  # what the client's own retries could not fix
                error, attempts = self._describe(exc), self._requests.count
                logger.warning(
                    "item %s failed after %d requests: %s", item["item_id"], attempts, error
                )
                return _Outcome(raw_text, None, attempts, error)
            else:
                if self.cache is not None:
                    self.cache.put(key, raw_text, self.model)
                return _Outcome(raw_text, annotation, self._requests.count, None)
            logger.debug("item %s: %s", item["item_id"], error)
        attempts = self._requests.count
        logger.warning("item %s failed after %d requests: %s", item["item_id"], attempts, error)
        return _Outcome(raw_text, None, attempts, error)

    def _messages(self, prompt: str, image_png: bytes) -> list[dict[str, Any]]:
        data_url = "data:image/png;base64," + base64.b64encode(image_png).decode("ascii")
        content = [
            {"type": "text", "text": prompt},
            {"type": "image_url", "image_url": {"url": data_url}},
        ]
        return [{"role": "user", "content": content}]

    def _ask(self, messages: list[dict[str, Any]]) -> str:
        """One chat completion (the client retries it); returns the reply's text."""
        options: dict[str, Any] = {}
        if self.response_format() is not None:
            options["response_format"] = self.response_format()
        if self.api_key is None:
            options["extra_headers"] = {"Authorization": openai.omit}
        response = self.client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=messages,
            temperature=0.0,  # annotations should not depend on sampling luck
            max_tokens=self.max_tokens,
            **options,
        )
        try:
            content = response.parse().choices[0].message.content
        except Exception as exc:  # an HTML page, a JSON body that is no chat completion ...
            preview = self._scrub(response.text[:4096])[:200]
            raise _BadReply(f"reply is not a chat completion: {preview!r}") from exc
        if not isinstance(content, str):
            raise _BadReply(f"reply content is not text: {self._scrub(repr(content)):.200}")
        return self._scrub(content)

    def _describe(self, exc: openai.APIError) -> str:
        """The error of a failed request, scrubbed of secrets."""
        if isinstance(exc, openai.APITimeoutError):
            return f"timed out after {self.timeout_s:g} s"
        if isinstance(exc, openai.APIStatusError):
            # Scrub before cutting: a cut through the key would leave half of it unrecognised.
            detail = self._scrub(exc.response.text[:4096])[:200]
            return f"HTTP {exc.status_code} from {self.url}: {detail}"
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            return self._scrub(f"connection failed: {cause}")
        return self._scrub(f"{type(exc).__name__}: {exc}")

    def _scrub(self, text: str) -> str:
        return scrub(text, [self.api_key])
