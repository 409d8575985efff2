"""When a served annotator asks again after a failed HTTP request, and how long it waits first.

The policy is the ``openai`` client's own (its ``_should_retry`` and
``_calculate_retry_timeout``), written out here because the annotator runs the retries itself:
the client would sleep through a ``Retry-After`` of two minutes whatever deadline the item has,
while :class:`creditflow.chain.annotation.openai_backend.OpenAIAnnotator` must not wait past it.

- Retried: no reply at all (a timeout, a refused or dropped connection) and HTTP 408, 409, 429
  and 5xx, unless the server says ``x-should-retry: false``; any status with
  ``x-should-retry: true``. Other statuses (400, 401, 404) fail at once: asking again cannot
  help.
- The wait: what ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date) asks, when it
  asks more than 0 and at most ``MAX_RETRY_AFTER_S``; a longer (or endless) wait is not
  retried. Without one, an exponential backoff ``INITIAL_BACKOFF_S * 2**retries_taken`` capped
  at ``MAX_BACKOFF_S``, less a random 0-25 % so that clients do not come back in step.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Callable, Mapping

MAX_RETRY_AFTER_S = 120.0
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
RETRIED_STATUSES = (408, 409, 429)  # and every status >= 500


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait a reply's headers ask for in seconds (``retry-after-ms`` first, then
    ``Retry-After`` as seconds or as an HTTP date), None when they ask none.

    >>> retry_after_s({"retry-after-ms": "1500", "retry-after": "9"})
    1.5
    >>> retry_after_s({"retry-after": "soon"}) is None
    True
    """
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            continue
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_tz(value)
        return None if when is None else float(email.utils.mktime_tz(when) - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def retry_wait(
    status: int | None,
    headers: Mapping[str, str],
    retries_taken: int,
    max_retries: int,
    jitter: Callable[[], float] = random.random,
) -> float | None:
    """Seconds to wait before asking again after a failed request, or None not to ask again.

    Args:
        status: the reply's HTTP status; None when no reply came (timeout, connection error).
        headers: the reply's headers (empty without a reply).
        retries_taken: retries already made for this request (0 after the first failure).
        max_retries: the most retries of one request.
        jitter: a draw in [0, 1) that takes up to 25 % off the backoff.

    >>> retry_wait(503, {}, retries_taken=1, max_retries=3, jitter=lambda: 0.0)
    1.0
    >>> retry_wait(429, {"Retry-After": "3"}, 0, 3)
    3.0
    >>> retry_wait(404, {}, 0, 3) is None, retry_wait(None, {}, 3, 3) is None
    (True, True)
    """
    if retries_taken >= max_retries:
        return None
    if status is not None:
        headers = {name.lower(): value for name, value in headers.items()}
        asked = retry_after_s(headers)
        if asked is not None and not (math.isfinite(asked) and asked <= MAX_RETRY_AFTER_S):
            return None
        say = headers.get("x-should-retry")
        retryable = status in RETRIED_STATUSES or status >= 500
        if say == "false" or (say != "true" and not retryable):
            return None
        if asked is not None and asked > 0:
            return asked
    backoff = min(INITIAL_BACKOFF_S * 2.0**retries_taken, MAX_BACKOFF_S)
    return backoff * (1.0 - 0.25 * jitter())
