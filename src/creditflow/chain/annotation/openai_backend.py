"""VLM annotator over an OpenAI-compatible chat-completions endpoint (docs/methods/experience.md, step 1).

The paper annotates with Qwen2.5-VL-32B; any server speaking the OpenAI chat API (vLLM, SGLang,
TGI, llama.cpp) can play that role, through the official ``openai`` client. Each item is one
request: the prompt (title, category and the schema) as text plus the cover as a base64 PNG
data URL, and, unless ``structured_output`` is off, ``response_format`` of type
``json_schema`` built from the annotation schema
(:func:`creditflow.chain.annotation.schema.annotation_json_schema`), which vLLM and SGLang enforce
with guided decoding, so replies are valid JSON of the schema's keys. Output is parsed with
:func:`creditflow.chain.annotation.schema.parse_annotation` either way.

Failure handling: a request that times out, cannot connect, or answers 408 / 409 / 429 / 5xx
is retried up to ``max_retries`` times, waiting what the server's ``Retry-After`` (or
``retry-after-ms``) header asks when it says (up to 2 minutes; a longer wait is not retried),
else an exponential backoff from 0.5 s (capped at 8 s, with jitter); other HTTP errors (400,
401, 404) fail at once, since repeating them cannot help (the ``openai`` client's policy,
:mod:`creditflow.chain.annotation.retry_policy`). A reply that holds no valid annotation is asked
again up to ``reply_retries`` times. An item that never succeeds gets ``status == "failed"``
with its last raw reply and the error, and no scores: nothing is invented and nothing raises.
``attempts`` counts the HTTP requests the item made.

Bounds against a slow, silent or endless server: ``timeout_s`` bounds each wait for bytes, but
a server trickling one byte a second never trips it, so every item also has a wall-clock
deadline, ``request_deadline_s`` for all its requests, retries, waits and reply retries
together, and the whole ``annotate`` call has ``step_deadline_s``. Each request's timeouts are
cut to the time left; a retry whose wait would end past the deadline is not made; and the
body is read as a stream that stops at the deadline. An item that reaches its deadline is
marked failed with an error naming the option; items whose turn comes after the step's
deadline are marked failed without a request (those in the cache are still served), and the
run goes on. A reply body over ``max_reply_bytes`` (announced by ``Content-Length`` or counted
while it streams; compressed replies, whose size would only show once inflated, are refused,
identity encoding being asked) fails its item the same way instead of being buffered whole. A
read already waiting is not cut short, so an item ends at most one ``timeout_s`` after its
deadline: n items take at most ``ceil(n / max_concurrency) * (request_deadline_s + timeout_s)``
and never more than ``step_deadline_s + timeout_s``.

Secrets: everything the server sends back (error bodies, replies) passes through
:func:`creditflow.redaction.scrub` before it is logged, cached or stored, so a 401 body that
echoes the key leaves ``[REDACTED]`` in ``item_annotations``. The key itself comes from Kedro
credentials or ``OPENAI_API_KEY`` (:mod:`creditflow.chain.annotation.credentials`), never parameters;
without one, requests carry no ``Authorization`` header.

Successful annotations are cached on disk (:mod:`creditflow.chain.annotation.cache`, on by default),
keyed by the image bytes, title, prompt, model and request settings, so a rerun only requests
what is missing; failures are not cached, so a rerun retries them.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx2  # the openai client's HTTP library: its hooks see each request and reply
import openai
import pandas as pd
from tqdm.auto import tqdm

from creditflow.chain.annotation.cache import DEFAULT_CACHE_DIR, AnnotationCache, open_cache
from creditflow.chain.annotation.retry_policy import retry_wait
from creditflow.chain.annotation.schema import (
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
from creditflow.errors import AnnotationParseError, AnnotatorLimitError
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
DEFAULT_REQUEST_DEADLINE_S = 60.0
DEFAULT_STEP_DEADLINE_S = 4 * 3600.0
DEFAULT_MAX_REPLY_BYTES = 1024 * 1024  # an annotation is under 4 KB, a completion around it ~1 KB


@dataclass(frozen=True)
class _Outcome:
    raw_text: str | None
    annotation: Annotation | None
    attempts: int
    error: str | None


@dataclass(frozen=True)
class _Deadline:
    """When an item's requests must have ended (``time.monotonic()``) and the option that says
    so, for the error."""

    at: float
    option: str

    def left(self) -> float:
        return self.at - time.monotonic()


class _BadReply(Exception):
    """A reply worth asking again: not a chat completion, or no valid annotation in it."""


class _CappedStream(httpx2.SyncByteStream):
    """A reply body read chunk by chunk that stops past ``max_bytes`` or past the deadline."""

    def __init__(self, stream: httpx2.SyncByteStream, max_bytes: int, deadline: _Deadline):
        self._stream, self._max_bytes, self._deadline = stream, max_bytes, deadline

    def __iter__(self) -> Iterator[bytes]:
        received = 0
        for chunk in self._stream:
            received += len(chunk)
            if received > self._max_bytes:
                raise AnnotatorLimitError(
                    f"reply body over max_reply_bytes={self._max_bytes} (cut off at {received} "
                    "bytes)"
                )
            if self._deadline.left() <= 0:
                raise AnnotatorLimitError(
                    f"{self._deadline.option} s passed while the reply was still arriving "
                    f"({received} bytes in)"
                )
            yield chunk

    def close(self) -> None:
        self._stream.close()


class OpenAIAnnotator:
    """Annotate items by asking a served VLM for the schema's JSON.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8000`` or ``http://host:8000/v1``;
            requests go to ``<root>/v1/chat/completions`` (``/v1`` is added when missing).
        model: model name sent in each request (and part of the cache key).
        api_key: sent as ``Authorization: Bearer <api_key>``; no header when None or empty
            (local servers). Pipelines pass it from Kedro credentials, not parameters.
        max_concurrency: requests in flight at once (>= 1).
        timeout_s: the longest wait for a connection or for the next bytes of a reply, in
            seconds (> 0); it does not bound a reply that trickles in (``request_deadline_s``
            does).
        max_retries: retries of one request after a timeout, a connection error or HTTP 408 /
            409 / 429 / 5xx (>= 0), honouring ``Retry-After``.
        reply_retries: requests again after a reply holding no valid annotation (>= 0).
        request_deadline_s: wall-clock seconds one item may take, all its requests, retries,
            waits and reply retries together (> 0); then it is marked failed.
        step_deadline_s: wall-clock seconds one ``annotate`` call may take (> 0); items not
            done by then are marked failed (cached ones are still served) and it returns.
        max_reply_bytes: the largest reply body read (> 0); a longer one fails its item.
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
        request_deadline_s: float = DEFAULT_REQUEST_DEADLINE_S,
        step_deadline_s: float = DEFAULT_STEP_DEADLINE_S,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
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
        bounds = {
            "request_deadline_s": (request_deadline_s, int | float),
            "step_deadline_s": (step_deadline_s, int | float),
            "max_reply_bytes": (max_reply_bytes, int),
        }
        for name, (value, kind) in bounds.items():
            if isinstance(value, bool) or not isinstance(value, kind) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
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
        self.request_deadline_s = float(request_deadline_s)
        self.step_deadline_s = float(step_deadline_s)
        self.max_reply_bytes = int(max_reply_bytes)
        # The item this thread annotates: its HTTP requests (.count) and its deadline.
        self._requests = threading.local()
        self._step_ends = math.inf  # time.monotonic() when the annotate call's time is up
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
        self._step_ends = time.monotonic() + self.step_deadline_s
        pool = ThreadPoolExecutor(max_workers=self.max_concurrency)
        try:
            done = pool.map(self._annotate_item_safely, records)
            outcomes = list(
                tqdm(done, total=len(records), desc="annotate", disable=not self.progress)
            )
        except BaseException:
            # Interrupted (hooks.termination raises RunInterrupted here on SIGTERM): queued items
            # are dropped and the error goes up at once, so the run's manifest and MLflow run
            # are closed now; requests in flight end within their deadlines, and the process
            # waits for them as it exits.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
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
        """The ``openai`` client, built on first use (one for all threads: it is thread-safe).
        It does not retry: :meth:`_ask` does, within the item's deadline."""
        if self._client is None:
            http_client = openai.DefaultHttpxClient(
                # Compressed replies could inflate far past max_reply_bytes (_bound_reply).
                headers={"Accept-Encoding": "identity"},
                event_hooks={"request": [self._count_request], "response": [self._bound_reply]},
            )
            self._client = openai.OpenAI(
                base_url=self.base_url,
                api_key=self.api_key or _NO_KEY,
                timeout=self.timeout_s,
                max_retries=0,
                http_client=http_client,
            )
        return self._client

    def _count_request(self, request: httpx2.Request) -> None:
        # Called in the sending thread (the client is synchronous), so a thread-local count is
        # the number of requests of the item that thread annotates, retries included.
        self._requests.count = getattr(self._requests, "count", 0) + 1

    def _bound_reply(self, response: httpx2.Response) -> None:
        # Called in the sending thread once a reply's headers are in, before its body is read
        # (the client would buffer all of it): the body streams through the cap instead.
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise AnnotatorLimitError(
                f"reply is compressed ({encoding}) although identity encoding was asked: "
                "its size could not be held to max_reply_bytes"
            )
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_reply_bytes:
            raise AnnotatorLimitError(
                f"reply of {int(length)} bytes announced, over max_reply_bytes="
                f"{self.max_reply_bytes}"
            )
        response.stream = _CappedStream(
            response.stream, self.max_reply_bytes, self._requests.deadline
        )

    def _item_deadline(self) -> _Deadline:
        """An item starting now must end by its own deadline or the step's, the earlier."""
        own = time.monotonic() + self.request_deadline_s
        if own <= self._step_ends:
            return _Deadline(own, f"request_deadline_s={self.request_deadline_s:g}")
        return _Deadline(self._step_ends, f"step_deadline_s={self.step_deadline_s:g}")

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
        deadline = self._requests.deadline = self._item_deadline()
        if deadline.left() <= 0:
            return _Outcome(None, None, 0, f"not sent: {deadline.option} s had passed")
        messages = self._messages(prompt, item["image_png"])
        raw_text, error = None, None
        for _ in range(self.reply_retries + 1):
            try:
                raw_text = self._ask(messages, deadline, error)
                annotation = parse_annotation(raw_text)
            except AnnotationParseError as exc:
                error = f"unparsable output: {exc}"
            except _BadReply as exc:
                error = str(exc)
            except (openai.APIError, AnnotatorLimitError) as exc:  # retrying could not fix it
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

    def _ask(
        self, messages: list[dict[str, Any]], deadline: _Deadline, last_error: str | None
    ) -> str:
        """One chat completion, asked again as :func:`retry_wait` says while ``deadline``
        leaves time; returns the reply's text.

        Raises:
            AnnotatorLimitError: the deadline passed, or a retry's wait would end past it.
            openai.APIError: a failure not worth retrying, or the last retry's.
        """
        retries_taken = 0
        while True:
            left = deadline.left()
            if left <= 0:
                last = f" (last: {last_error})" if last_error else ""
                raise AnnotatorLimitError(f"gave up: {deadline.option} s passed{last}")
            timeout = min(self.timeout_s, left)  # a request ends by the deadline too
            try:
                return self._ask_once(messages, timeout)
            except openai.APIStatusError as exc:
                failure, status, headers = exc, exc.status_code, exc.response.headers
            except openai.APIConnectionError as exc:  # no reply: a timeout, a refused connection
                failure, status, headers = exc, None, {}
            last_error = self._describe(failure, timeout)
            wait = retry_wait(status, headers, retries_taken, self.max_retries)
            if deadline.left() <= 0:
                continue  # the deadline cut this request short: the error names it
            if wait is None:
                raise failure
            if wait >= deadline.left():
                raise AnnotatorLimitError(
                    f"gave up: {deadline.option} s leaves no time for the {wait:.3g} s wait "
                    f"before retrying (last: {last_error})"
                )
            logger.debug("retrying in %.2f s after %s", wait, last_error)
            time.sleep(wait)
            retries_taken += 1

    def _ask_once(self, messages: list[dict[str, Any]], timeout: float) -> str:
        """One chat completion request; returns the reply's text."""
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
            timeout=timeout,
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

    def _describe(
        self, exc: openai.APIError | AnnotatorLimitError, timeout: float | None = None
    ) -> str:
        """The error of a failed request (that waited ``timeout``, default ``timeout_s``),
        scrubbed of secrets."""
        if isinstance(exc, AnnotatorLimitError):
            return self._scrub(str(exc))
        if isinstance(exc, openai.APITimeoutError):
            return f"timed out after {self.timeout_s if timeout is None else timeout:.3g} s"
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
