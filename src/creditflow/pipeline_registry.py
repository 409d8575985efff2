"""Project pipelines."""

from __future__ import annotations

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline

# What a bare `kedro run` runs: the experience-model chain of docs/methods/experience.md, from the synthetic
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
    """Each pipeline of ``creditflow.pipelines`` by its folder name. ``__default__`` (a bare
    ``kedro run``, and ``make run``) runs DEFAULT_PIPELINES, sized to finish in under 10
    minutes on a 2-core CPU.

    A pipeline that reads ingested tables (``tapo`` reads ``mgsm_problems``, ``tor`` the
    TabMWP and MATH-Vision tables, ``movielens_eval`` the ratings) reads the versions
    ``kedro run --pipelines data_ingest`` saved; it does not re-ingest (and re-save unchanged
    copies) on every run. A run whose inputs were never saved fails before its first node
    saying which pipeline makes them (``hooks.pinned_versions.PinnedVersionsHook``).
    """
    pipelines = find_pipelines(raise_errors=True)
    pipelines["__default__"] = sum(
        (pipelines[name] for name in DEFAULT_PIPELINES if name in pipelines), Pipeline([])
    )
    return pipelines
