"""A quiet console: warnings a user cannot act on are silenced where they arise, and the
catalog's "Replacing dataset" warning is kept for replacements nobody meant.

- OmegaConf's ``register_new_resolver() is deprecated``: raised inside Kedro's and
  kedro-mlflow's own config loaders, several times a run; nothing in this project calls it.
- MLflow's ``Add type hints to the `predict` method``: raised when MLflow imports its pyfunc
  module; this project logs no pyfunc model.
- ``Replacing dataset 'credentials'`` and the like: the project's hooks put datasets into the
  catalog on purpose (the credentials, a task source under its node's input name, an empty
  stand-in for an optional real-data set); :func:`replace_dataset` records those names, and
  only their warnings are dropped.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

_REPLACED_ON_PURPOSE: set[str] = set()


def quiet_known_noise() -> None:
    """Install the warning filters and the catalog log filter (idempotent)."""
    warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated")
    warnings.filterwarnings("ignore", message=r"\s*Add type hints to the `predict` method")
    catalog_logger = logging.getLogger("kedro.io.data_catalog")
    if not any(isinstance(f, _PlannedReplacements) for f in catalog_logger.filters):
        catalog_logger.addFilter(_PlannedReplacements())


def replace_dataset(catalog: Any, name: str, dataset: Any) -> None:
    """``catalog[name] = dataset``, a replacement the project means (no warning for it)."""
    _REPLACED_ON_PURPOSE.add(name)
    catalog[name] = dataset


class _PlannedReplacements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        planned = (
            record.msg == "Replacing dataset '%s'"
            and bool(record.args)
            and record.args[0] in _REPLACED_ON_PURPOSE
        )
        return not planned
