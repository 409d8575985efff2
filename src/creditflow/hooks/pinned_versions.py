"""PinnedVersionsHook: a run loads the dataset versions it started with, and fails before its first
node when an input was never saved."""

from __future__ import annotations

import importlib
import logging
import pkgutil

from kedro.framework.hooks import hook_impl
from kedro.io import AbstractVersionedDataset, CatalogProtocol, MemoryDataset
from kedro.io.core import VersionNotFoundError
from kedro.pipeline import Pipeline

import creditflow.pipelines as package
from creditflow.errors import MissingInputsError
from creditflow.hooks.console import replace_dataset
from creditflow.hooks.refusal import refuses
from creditflow.ingest.schemas import TASK_TABLE_SCHEMAS, empty_frame

logger = logging.getLogger(__name__)


class PinnedVersionsHook:
    """Keeps a run to its own dataset versions when other runs share the project folder.

    Kedro loads an unpinned versioned dataset at the newest version on disk at the moment of
    the load, so a run that saved ``tapo_sft_policy`` could load another run's newer one a
    node later (Kedro only warns). Before the first node this pins, for every versioned
    dataset of the run without a ``--load-versions`` pin:

    - a dataset the run writes: its load version to the run's save version (a node reads what
      this run's own upstream node saved);
    - a dataset the run only reads: its load version to the newest version at the start of the
      run (a run started later cannot change the inputs of one in progress). One with no
      version yet fails the run before its first node, naming the pipeline that saves it
      (``kedro run --pipelines data_ingest`` for the ingested tables).
    """

    @hook_impl
    @refuses
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        outputs = pipeline.all_outputs()
        pinned: dict[str, str] = {}
        never_saved: list[str] = []
        for name in sorted(pipeline.datasets()):
            dataset = catalog.get(name) if name in catalog else None
            if not isinstance(dataset, AbstractVersionedDataset) or not dataset._version:
                continue
            version = dataset._version  # Kedro's Version(load, save); no public setter
            if version.load:
                continue  # --load-versions: the user's choice stands
            if name in outputs:
                save = dataset.resolve_save_version()
                dataset._version = version._replace(load=save, save=save)
            else:
                try:
                    pinned[name] = dataset.resolve_load_version()
                except VersionNotFoundError:
                    never_saved.append(name)
                    continue
                dataset._version = version._replace(load=pinned[name])
        never_saved = [n for n in never_saved if not _skip_evaluation_rows(n, pipeline, catalog)]
        if never_saved:
            raise MissingInputsError(_missing_inputs_message(never_saved))
        if pinned:
            logger.info(
                "inputs pinned for this run: %s",
                ", ".join(f"{name}@{version}" for name, version in pinned.items()),
            )


def _skip_evaluation_rows(name: str, pipeline: Pipeline, catalog: CatalogProtocol) -> bool:
    """Whether a never-saved input is an optional real-data set that the run reads only to
    evaluate on (catalog ``metadata: {optional: true, task_schema: ...}``, read by
    ``evaluate_*`` nodes only); then it is replaced by an empty table of its schema, so a fresh
    clone runs tapo and tor on their synthetic worlds, and one line says how to add the rows."""
    metadata = getattr(catalog.get(name), "metadata", None) or {}
    readers = [node.name.rpartition(".")[2] for node in pipeline.nodes if name in node.inputs]
    schema = TASK_TABLE_SCHEMAS.get(metadata.get("task_schema"))
    if not (metadata.get("optional") and schema and readers):
        return False
    if not all(reader.startswith("evaluate_") for reader in readers):
        return False
    replace_dataset(catalog, name, MemoryDataset(empty_frame(schema), copy_mode="assign"))
    logger.warning(
        "%s has no saved version: the evaluation skips its rows. To add them: `creditflow "
        "fetch-data --from <copy>` (or without --from, to download), then `kedro run "
        "--pipelines data_ingest`",
        name,
    )
    return True


def _every_pipeline() -> dict[str, Pipeline]:
    """Each pipeline package's ``create_pipeline()`` by its name, as ``find_pipelines`` finds
    them; not through it: within a ``kedro run --pipelines X`` it returns only X."""
    found = {}
    for module in pkgutil.iter_modules(package.__path__):
        if module.ispkg:
            create = getattr(
                importlib.import_module(f"{package.__name__}.{module.name}"),
                "create_pipeline",
                None,
            )
            if create is not None:
                found[module.name] = create()
    return found


def _missing_inputs_message(names: list[str]) -> str:
    """Which registered pipeline saves each of ``names`` (the smallest one that does)."""
    pipelines = _every_pipeline()
    lines = []
    for name in names:
        producers = sorted(
            (len(p.nodes), pipeline_name)
            for pipeline_name, p in pipelines.items()
            if name in p.all_outputs()
        )
        how = (
            f"run `kedro run --pipelines {producers[0][1]}` first"
            if producers
            else "no registered pipeline saves it: add it to the catalog's data"
        )
        lines.append(f"{name}: {how}")
    return (
        "this run reads datasets that have no saved version yet (nothing ran):\n  "
        + "\n  ".join(lines)
    )
