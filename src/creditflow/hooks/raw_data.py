"""RawDataHook: a run that ingests a raw data set absent from the project fails before its first
node, saying how to fetch it (docs/data.md)."""

from __future__ import annotations

from kedro.framework.hooks import hook_impl
from kedro.io import CatalogProtocol
from kedro.pipeline import Pipeline

PARAMS = "params:data_ingest"


class RawDataHook:
    """Fails a run whose data_ingest nodes read a raw data set that is not (completely) in
    ``data_ingest.raw_data_dir``, naming the sets, what of them is missing and the fetch
    command, before its first node (without it the run would stop in the middle, at the first
    node whose file is absent)."""

    @hook_impl
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        if PARAMS not in pipeline.inputs():
            return
        # Imported here: settings.py imports this module for every kedro command (kedro
        # --help, kedro viz), and the ingest loaders pull in pandas; by the time a run starts
        # its pipelines have imported it.
        from creditflow.pipelines.data_ingest.pipeline import (  # noqa: PLC0415
            check_pipeline_raw_data,
        )

        check_pipeline_raw_data(pipeline, catalog.load(PARAMS))
