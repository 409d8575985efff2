"""CredentialsHook: the Kedro credentials as the ``credentials`` dataset."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kedro.framework.hooks import hook_impl
from kedro.io import CatalogProtocol, MemoryDataset

if TYPE_CHECKING:
    pass
CREDENTIALS_DATASET = "credentials"


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
    def after_catalog_created(self, catalog: CatalogProtocol, conf_creds: dict[str, Any]) -> None:
        catalog[CREDENTIALS_DATASET] = MemoryDataset(dict(conf_creds))
