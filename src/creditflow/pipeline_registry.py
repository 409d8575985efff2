"""Project pipelines."""

from __future__ import annotations

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline

from creditflow.pipelines.data_ingest import create_pipeline as create_ingest_pipeline


def register_pipelines() -> dict[str, Pipeline]:
    """Each pipeline of ``creditflow.pipelines`` by its folder name, made runnable on its own:
    a pipeline that reads ingested tables (e.g. ``tapo`` reads ``mgsm_problems``) also gets
    the ``data_ingest`` nodes that produce them. ``__default__`` runs everything.
    """
    # Kedro 1.7 may discover only the requested pipelines, so data_ingest is built here.
    pipelines = find_pipelines(raise_errors=True)
    ingest = create_ingest_pipeline()
    for name, pipeline in list(pipelines.items()):
        if name == "data_ingest":
            continue
        needed = pipeline.inputs() & ingest.all_outputs()
        if needed:
            pipelines[name] = ingest.only_nodes_with_outputs(*needed) + pipeline
    pipelines["__default__"] = sum(pipelines.values())
    return pipelines
