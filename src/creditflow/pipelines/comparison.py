"""Per-strategy comparisons as Kedro modular pipelines (the ``tapo`` and ``tor`` pipelines).

One template (train -> evaluate, written once per pipeline) is instantiated with
``pipeline(template, namespace=strategy)`` for every strategy listed under
``<group>.strategies`` in ``conf/<env>/parameters_<group>.yml``. Adding a strategy is a YAML
change; kedro-viz shows each strategy as a collapsible group, and
``kedro run --pipelines tapo --namespaces tapo`` runs one strategy's train and evaluate from
the stored warm start.

The strategy list is read when the pipeline is built, from the configuration files (base,
then the ``KEDRO_ENV`` environment, ``local`` by default): Kedro builds pipelines before it
knows ``--params``, so ``--params`` can change a listed strategy's settings but cannot add one
(the comparison node then fails, saying so, instead of leaving it out silently).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from kedro.config import OmegaConfigLoader
from kedro.pipeline import Pipeline, pipeline

RESULTS_PREFIX, METRICS_PREFIX = "results/", "metrics/"


def project_root() -> Path:
    """The Kedro project this code runs in: the nearest folder at or above the working
    directory whose ``pyproject.toml`` declares ``[tool.kedro]``, else this checkout's root."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "[tool.kedro]" in pyproject.read_text(encoding="utf-8"):
            return folder
    return Path(__file__).resolve().parents[3]


def configured_strategies(group: str, conf_source: str | Path | None = None) -> list[str]:
    """The strategy names under ``<group>.strategies`` in the project's parameters, in file
    order. Raises ValueError when there are none."""
    conf_source = conf_source or project_root() / "conf"
    loader = OmegaConfigLoader(
        str(conf_source),
        base_env="base",
        default_run_env="local",
        env=os.environ.get("KEDRO_ENV"),
    )
    strategies = (loader["parameters"].get(group) or {}).get("strategies") or {}
    if not strategies:
        raise ValueError(
            f"no strategies under {group}.strategies in {conf_source}/*/parameters_{group}.yml; "
            "list at least one"
        )
    return list(strategies)


def strategy_pipelines(
    template: Pipeline,
    group: str,
    strategies: Sequence[str],
    shared_inputs: set[str],
    outputs: Mapping[str, str],
) -> Pipeline:
    """``template`` once per strategy, namespaced by the strategy's name.

    Args:
        template: the per-strategy nodes; they read ``params:<group>`` (shared), ``params:
            strategy`` (mapped to ``params:<group>.strategies.<name>``) and ``checkpoints``
            (mapped to ``<group>_checkpoints_<name>``).
        shared_inputs: datasets every strategy reads under their own names (the warm start,
            the tasks, ...).
        outputs: template dataset -> stable catalog name with a ``{strategy}`` field (for
            example ``{"policy": "tapo_policy_{strategy}"}``), so ``--load-versions`` examples
            and the docs keep their names.
    """
    instances = [
        pipeline(
            template,
            namespace=name,
            inputs={**{d: d for d in shared_inputs}, "checkpoints": f"{group}_checkpoints_{name}"},
            outputs={d: pattern.format(strategy=name) for d, pattern in outputs.items()},
            parameters={
                f"params:{group}": f"params:{group}",
                "params:strategy": f"params:{group}.strategies.{name}",
            },
        )
        for name in strategies
    ]
    return sum(instances, Pipeline([]))


def comparison_inputs(
    group: str, strategies: Sequence[str], results: str, metrics: str
) -> dict[str, str]:
    """Keyword inputs of a comparison node: ``results/<name>`` and ``metrics/<name>`` per
    strategy (``results`` / ``metrics``: catalog patterns with a ``{strategy}`` field)."""
    inputs = {"params": f"params:{group}"}
    for name in strategies:
        inputs[RESULTS_PREFIX + name] = results.format(strategy=name)
        inputs[METRICS_PREFIX + name] = metrics.format(strategy=name)
    return inputs


def labelled_tables(
    configured: Mapping[str, object], warm_start: pd.DataFrame, tables: Mapping[str, pd.DataFrame]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(evaluations, training metrics)`` of a comparison: the warm start's evaluation
    labelled ``policy="sft"``, each strategy's labelled with its name (``policy`` and
    ``strategy`` columns), concatenated in strategy order.

    Raises:
        ValueError: a strategy of the parameters has no tables in the pipeline (it was added
            with ``--params``, after the pipeline was built).
    """
    names = [key[len(RESULTS_PREFIX) :] for key in tables if key.startswith(RESULTS_PREFIX)]
    missing = sorted(set(configured) - set(names))
    if missing:
        raise ValueError(
            f"strategies {missing} are in the parameters but not in the pipeline: the strategy "
            "list is read from conf/ when the pipeline is built, so --params cannot add one; "
            "add it to the parameters file instead"
        )
    evaluations = [warm_start.assign(policy="sft")]
    evaluations += [tables[RESULTS_PREFIX + n].assign(policy=n) for n in names]
    metrics = [tables[METRICS_PREFIX + n].assign(strategy=n) for n in names]
    return pd.concat(evaluations, ignore_index=True), pd.concat(metrics, ignore_index=True)
