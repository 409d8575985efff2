"""Project pipelines."""

from __future__ import annotations

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline

from creditflow.pipelines.data_ingest import create_pipeline as create_ingest_pipeline

# What a bare `kedro run` runs: the experience-model chain of SPEC section 3, from the synthetic
# catalogue to the evaluation table; the other pipelines (tapo, tor, data_ingest) run with
# `kedro run --pipelines NAME`.
DEFAULT_PIPELINES = (
    "annotation",
    "expmodel_sft",
    "expmodel_pft",
    "experience_scoring",
    "augmented_targets",
    "reranker_pretrain",
    "reranker_grpo",
    "reranker_eval",
)


def register_pipelines() -> dict[str, Pipeline]:
    """Each pipeline of ``creditflow.pipelines`` by its folder name, made runnable on its own:
    a pipeline that reads ingested tables (e.g. ``tapo`` reads ``mgsm_problems``) also gets
    the ``data_ingest`` nodes that produce them. ``__default__`` (a bare ``kedro run``, and
    ``make run``) runs DEFAULT_PIPELINES, sized to finish in under 10 minutes on a 2-core CPU.
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
    pipelines["__default__"] = sum(
        (pipelines[name] for name in DEFAULT_PIPELINES if name in pipelines), Pipeline([])
    )
    return pipelines
