"""CredentialsHook: the Kedro credentials as the ``credentials`` dataset."""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kedro.framework.hooks import hook_impl
from kedro.io import CatalogProtocol, MemoryDataset

from creditflow.hooks.console import replace_dataset

if TYPE_CHECKING:
    from kedro.framework.context import KedroContext

logger = logging.getLogger(__name__)
CREDENTIALS_DATASET = "credentials"


def readable_by_others(paths: Iterable[Path]) -> list[tuple[Path, int]]:
    """``(path, mode)`` of each file that users other than its owner may read (group or world
    read bit): a credentials file holds API keys."""
    found = []
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            found.append((path, mode))
    return found


class CredentialsHook:
    """Puts the Kedro credentials in the catalog as the ``credentials`` dataset.

    Kedro hands credentials to datasets only (a catalog entry's ``credentials: <name>``); a
    node that talks to a service itself (the ``openai`` annotator) takes this dataset as an
    input instead and picks the entry its options name. The values are whatever the config
    loader read from ``conf/base`` and ``conf/<env>`` (``credentials*.yml``, ``${oc.env:...}``
    resolved), held in memory only: the dataset is a MemoryDataset, so manifests record its
    type, never its data.
    """

    @hook_impl
    def after_context_created(self, context: KedroContext) -> None:
        loader = context.config_loader
        envs = {getattr(loader, "base_env", None), loader.env or loader.default_run_env}
        conf = Path(loader.conf_source)
        files = sorted(p for env in envs if env for p in (conf / env).glob("credentials*.yml"))
        for path, mode in readable_by_others(files):
            logger.warning(
                "%s is readable by other users (mode %o) and holds credentials: chmod 600 %s",
                path,
                mode,
                path,
            )

    @hook_impl
    def after_catalog_created(self, catalog: CatalogProtocol, conf_creds: dict[str, Any]) -> None:
        replace_dataset(catalog, CREDENTIALS_DATASET, MemoryDataset(dict(conf_creds)))
