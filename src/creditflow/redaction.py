"""Keep secrets out of what the project writes: run manifests, MLflow params, logs and tables.

Two helpers, used everywhere the project writes parameters or stores a server's reply:

- :func:`redact` replaces the value of every key that names a secret (``api_key``,
  ``hf_token``, ``password`` ...), at any depth of nested mappings and lists;
- :func:`scrub` replaces secrets inside free text (an HTTP error body echoing the key): the
  known secret strings, ``Bearer <token>`` and ``sk-...`` shaped keys.

A key names a secret when its last word is one of :data:`SECRET_WORDS` (case-insensitive;
words split at ``_``, ``-``, ``.``, spaces and camelCase). Matching the last word rather than
any substring keeps the project's own knobs readable: ``num_key_value_heads``,
``max_new_tokens``, ``token_weights`` and ``tokenizer`` are settings, not secrets (a substring
match on "key" / "token" would hide half of a training manifest).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[REDACTED]"
SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "secrets", "password", "passwd", "authorization"}
)
# Shorter strings are not replaced literally: they would garble text and guard nothing.
MIN_SECRET_LENGTH = 6

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# "Bearer <token>" in an echoed header, and OpenAI-style keys (sk-..., sk-proj-...).
_BEARER = re.compile(r"(?i)\b(bearer)\s+[^\s\"',;]+")
_SK_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")


def is_secret_key(name: object) -> bool:
    """Whether a parameter named ``name`` holds a secret (its last word is a secret word).

    >>> [is_secret_key(k) for k in ("api_key", "HF_TOKEN", "apiKey", "num_key_value_heads")]
    [True, True, True, False]
    """
    words = _WORD.findall(str(name))
    return bool(words) and words[-1].lower() in SECRET_WORDS


def redact(value: Any) -> Any:
    """A copy of ``value`` with every secret-named key's value replaced by :data:`REDACTED`.

    Mappings become dicts and lists / tuples lists, walked at any depth; other values are
    returned as they are. A secret-named key holding None keeps it (no secret to hide, and
    "no key was set" is worth reading in a manifest).

    >>> redact({"annotator": {"options": {"api_key": "sk-x", "model": "m"}}, "steps": [1]})
    {'annotator': {'options': {'api_key': '[REDACTED]', 'model': 'm'}}, 'steps': [1]}
    """
    if isinstance(value, Mapping):
        return {
            key: REDACTED if is_secret_key(key) and item is not None else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(item) for item in value]
    return value


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with each of ``secrets``, ``Bearer <token>`` and ``sk-...`` keys replaced.

    >>> scrub('{"error": "bad key abc123xyz", "auth": "Bearer abc123xyz"}', ["abc123xyz"])
    '{"error": "bad key [REDACTED]", "auth": "Bearer [REDACTED]"}'
    """
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, REDACTED)
    text = _BEARER.sub(rf"\1 {REDACTED}", text)
    return _SK_KEY.sub(REDACTED, text)
