"""Project pipelines."""

from __future__ import annotations

import difflib
import importlib.resources

import click
from kedro.framework.project import find_pipelines, pipelines
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
    # The names `kedro run --pipelines` asked for (Kedro keeps them there for find_pipelines).
    check_requested_pipelines(getattr(pipelines, "_requested_pipelines", None))
    found = find_pipelines(raise_errors=True)
    found["__default__"] = sum(
        (found[name] for name in DEFAULT_PIPELINES if name in found), Pipeline([])
    )
    return found


class UnknownPipelineError(click.UsageError):
    """A pipeline name that is no folder of ``creditflow.pipelines``. A usage error, so the CLI
    prints its message in a few lines instead of a traceback through Kedro's loader."""


def pipeline_names() -> list[str]:
    """The project's pipelines: the folders of ``creditflow.pipelines`` (what Kedro finds)."""
    package = importlib.resources.files("creditflow.pipelines")
    return sorted(
        p.name for p in package.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
    )


def check_requested_pipelines(requested: list[str] | None) -> None:
    """UnknownPipelineError naming each requested pipeline that does not exist, the closest
    one and the valid ones (``kedro run --pipelines tpao``)."""
    valid = pipeline_names()
    unknown = [name for name in requested or [] if name not in {*valid, "__default__"}]
    if not unknown:
        return
    parts = []
    for name in unknown:
        guess = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
        parts.append(f"`{name}`" + (f" (did you mean `{guess[0]}`?)" if guess else ""))
    raise UnknownPipelineError(
        f"unknown pipeline {', '.join(parts)}; valid pipelines: {', '.join(valid)}"
    )
