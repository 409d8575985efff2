"""Where an annotator's secret comes from: Kedro credentials, then the environment.

Parameters are written to run manifests and MLflow, so a key never goes there. The ``openai``
annotator names an entry of the Kedro credentials (``conf/local/credentials.yml``, git-ignored)
with the option ``credentials: <entry>``; the entry holds ``api_key``. With no entry named, the
key is ``OPENAI_API_KEY`` from the environment, and with neither no ``Authorization`` header is
sent (a local vLLM / llama.cpp server needs none), with a warning saying so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from creditflow.errors import ConfigError
from creditflow.redaction import is_secret_key

logger = logging.getLogger(__name__)

API_KEY_ENV = "OPENAI_API_KEY"
CREDENTIALS_FILE = "conf/local/credentials.yml"
OPTIONS = "annotation.annotator.options"
# Annotators that send a key; it arrives as their ``api_key`` keyword.
KEYED_ANNOTATORS = frozenset({"openai"})


def resolve_annotator_options(
    name: str,
    options: Mapping[str, Any],
    credentials: Mapping[str, Any],
    environ: Mapping[str, str] = os.environ,
) -> dict[str, Any]:
    """The annotator's keyword options with ``credentials: <entry>`` replaced by its key.

    Args:
        name: the annotator's name (``annotation.annotator.name``).
        options: its options from parameters; a secret-named one (``api_key``, ``token`` ...)
            is refused, since parameters end up in manifests and MLflow.
        credentials: the Kedro credentials (the ``credentials`` dataset that
            :class:`creditflow.hooks.credentials.CredentialsHook` fills from ``conf/<env>/credentials*``).
        environ: where ``OPENAI_API_KEY`` is looked up when no entry is named.

    Raises:
        ConfigError: a secret in parameters, ``credentials`` given to an annotator that sends
            no key, or a named entry that is missing or holds no ``api_key``. Messages name the
            entry and the file, never a secret.
    """
    secrets = sorted(str(key) for key in options if is_secret_key(key))
    if secrets:
        raise ConfigError(
            f"{OPTIONS}.{secrets[0]}: secrets do not belong in parameters (they are written to "
            f"run manifests and MLflow). Put the key in {CREDENTIALS_FILE} under an entry, e.g. "
            f"'my_openai: {{api_key: ...}}', and set {OPTIONS}.credentials: my_openai (or export "
            f"{API_KEY_ENV})."
        )
    resolved = dict(options)
    entry = resolved.pop("credentials", None)
    if name not in KEYED_ANNOTATORS:
        if entry is not None:
            raise ConfigError(
                f"{OPTIONS}.credentials: the {name!r} annotator sends no key; only "
                f"{sorted(KEYED_ANNOTATORS)} take credentials"
            )
        return resolved
    if entry is None:
        resolved["api_key"] = environ.get(API_KEY_ENV) or None
        if resolved["api_key"] is None:
            logger.warning(
                "openai annotator: no %s.credentials entry and no %s set; requests carry no "
                "Authorization header (fine for a local server, a 401 from a hosted one)",
                OPTIONS,
                API_KEY_ENV,
            )
        return resolved
    resolved["api_key"] = _api_key(entry, credentials)
    return resolved


def _api_key(entry: object, credentials: Mapping[str, Any]) -> str:
    if not isinstance(entry, str) or entry not in credentials:
        found = ", ".join(sorted(map(str, credentials))) or "none"
        raise ConfigError(
            f"{OPTIONS}.credentials names {entry!r}, which is not an entry of the Kedro "
            f"credentials ({CREDENTIALS_FILE}, or conf/<env>/credentials*.yml for --env; "
            f"entries found: {found}). Add '{entry}: {{api_key: ...}}' there."
        )
    value = credentials[entry]
    key = value.get("api_key") if isinstance(value, Mapping) else None
    if not isinstance(key, str) or not key:
        raise ConfigError(
            f"credentials entry {entry!r} ({CREDENTIALS_FILE}) needs a non-empty string "
            f"'api_key' (use ${{oc.env:{API_KEY_ENV}}} to take it from the environment)"
        )
    return key
