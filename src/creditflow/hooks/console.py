"""A quiet console: warnings a user cannot act on are silenced where they arise, and the
catalog's "Replacing dataset" warning is kept for replacements nobody meant.

- OmegaConf's ``register_new_resolver() is deprecated``: raised inside Kedro's and
  kedro-mlflow's own config loaders, several times a run; nothing in this project calls it.
- MLflow's ``Add type hints to the `predict` method``: raised when kedro-mlflow defines its
  pyfunc model class; this project logs no pyfunc model. MLflow raises it under its own
  ``simplefilter("once")``, which outranks any filter of ours, so it is also dropped where
  Kedro's CLI sends warnings: the ``py.warnings`` logger (``logging.captureWarnings``).
- Log lines that wrap at 80 columns: without a terminal (a CI log, ``kedro run > run.log``)
  rich takes the console to be 80 characters wide, and with the time, level and source
  columns a logged table keeps about 40 of them, one value a line. :func:`widen_log_console`
  gives such a console ``NO_TERMINAL_WIDTH`` columns through ``COLUMNS``, which rich reads
  each time it measures the console (a ``COLUMNS`` the user set wins).
- ``Replacing dataset 'credentials'`` and the like: the project's hooks put datasets into the
  catalog on purpose (the credentials, a task source under its node's input name, an empty
  stand-in for an optional real-data set); :func:`replace_dataset` records those names, and
  only their warnings are dropped.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

_REPLACED_ON_PURPOSE: set[str] = set()
NO_TERMINAL_WIDTH = 200


def widen_log_console() -> None:
    """Where standard output is no terminal and ``COLUMNS`` is unset, set it to
    ``NO_TERMINAL_WIDTH`` (a terminal keeps its own width)."""
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        os.environ["COLUMNS"] = str(NO_TERMINAL_WIDTH)


def quiet_known_noise() -> None:
    """Install the warning filters and the catalog log filter (idempotent)."""
    warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated")
    # MLflow colours this one: its message starts with an ANSI escape ("\x1b[33m").
    warnings.filterwarnings(
        "ignore", message=r"(\x1b\[[0-9;]*m)?\s*Add type hints to the `predict` method"
    )
    warnings_logger = logging.getLogger("py.warnings")
    if not any(isinstance(f, _KnownWarnings) for f in warnings_logger.filters):
        warnings_logger.addFilter(_KnownWarnings())
    catalog_logger = logging.getLogger("kedro.io.data_catalog")
    if not any(isinstance(f, _PlannedReplacements) for f in catalog_logger.filters):
        catalog_logger.addFilter(_PlannedReplacements())


def replace_dataset(catalog: Any, name: str, dataset: Any) -> None:
    """``catalog[name] = dataset``, a replacement the project means (no warning for it)."""
    _REPLACED_ON_PURPOSE.add(name)
    catalog[name] = dataset


class _KnownWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Add type hints to the `predict` method" not in record.getMessage()


class _PlannedReplacements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        planned = (
            record.msg == "Replacing dataset '%s'"
            and bool(record.args)
            and record.args[0] in _REPLACED_ON_PURPOSE
        )
        return not planned
