"""TaskSourceHook: puts each comparison's task source under its fixed node input name
(creditflow.config.task_sources)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kedro.framework.hooks import hook_impl
from kedro.io import AbstractVersionedDataset, CatalogProtocol, MemoryDataset
from kedro.io.core import VersionNotFoundError
from kedro.pipeline import Pipeline

from creditflow.config.task_sources import SYNTHETIC, TASK_SOURCES, source_problem
from creditflow.errors import ConfigError, MissingInputsError
from creditflow.hooks.console import replace_dataset
from creditflow.hooks.refusal import refuses


class TaskSourceHook:
    """Registers each comparison's task source under its fixed input name (module docstring);
    fails a run that reads a source that is unknown, versioned and never saved, or a CSV file
    whose header repeats a column name, before its first node."""

    def __init__(self) -> None:
        self._problems: dict[str, str] = {}  # input name -> what is wrong with its source
        self._sources: dict[str, str] = {}  # input name -> the catalog dataset it stands for

    @hook_impl
    def after_catalog_created(
        self,
        catalog: CatalogProtocol,
        conf_catalog: dict[str, Any],
        parameters: dict[str, Any],
    ) -> None:
        self._problems, self._sources = {}, {}
        tree = parameters.get("parameters") or {}
        for entry, spec in TASK_SOURCES.items():
            if not isinstance(tree.get(spec.group), Mapping):
                continue  # this project (or env) has no such group
            source = spec.value(tree)
            problem = source_problem(entry, source, conf_catalog)
            if problem is not None:
                self._problems[spec.dataset] = problem
            elif source == SYNTHETIC or not isinstance(source, str):
                replace_dataset(catalog, spec.dataset, MemoryDataset(None))
            else:
                replace_dataset(catalog, spec.dataset, catalog.get(source))
                self._sources[spec.dataset] = source

    @hook_impl
    @refuses
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        inputs = pipeline.inputs()
        problems = [problem for name, problem in self._problems.items() if name in inputs]
        if problems:
            raise ConfigError("\n".join(problems))
        # Imported here: settings.py imports this module for every kedro command (kedro
        # --help, kedro viz), and the source checks pull in pandas; by the time a run starts
        # its pipelines have imported it.
        from creditflow.ingest.source_rows import check_csv_header  # noqa: PLC0415

        for name, source in self._sources.items():
            dataset = catalog.get(name) if name in inputs else None
            if not isinstance(dataset, AbstractVersionedDataset):
                continue
            try:
                dataset.resolve_load_version()
            except VersionNotFoundError as error:
                raise MissingInputsError(
                    f"the task source `{source}` ({name}) has no saved version yet: run the "
                    "pipeline that saves it first (`kedro run --pipelines data_ingest` for the "
                    "ingested tables)"
                ) from error
            check_csv_header(dataset, source)
