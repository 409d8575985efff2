"""Per-strategy comparisons as Kedro modular pipelines (the ``tapo`` and ``tor`` pipelines).

One template (train -> evaluate, written once per pipeline) is instantiated with
``pipeline(template, namespace=strategy)`` for every strategy listed under
``<group>.strategies`` in ``conf/<env>/parameters_<group>.yml``. Adding a strategy is a YAML
change; kedro-viz shows each strategy as a collapsible group, and
``kedro run --pipelines tapo --namespaces tapo`` runs one strategy's train and evaluate from
the stored warm start.

The strategy list is read when the pipeline is built, from the configuration files (base,
then the ``KEDRO_ENV`` environment, ``local`` by default): Kedro builds pipelines before it
knows ``--params`` or ``--env``, so those can change a listed strategy's settings but cannot
add one. ``check_strategies`` (run by ``hooks.ParameterCheckHook`` before the first node)
then fails the run, saying so, instead of leaving the strategy out silently.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd
from kedro.config import OmegaConfigLoader
from kedro.framework.project import settings
from kedro.pipeline import Node, Pipeline, pipeline

from creditflow.training.grpo_runs import check_comparison_params

RESULTS_PREFIX, METRICS_PREFIX = "results/", "metrics/"
STRATEGY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a namespace and a dataset-name part
WARM_START = "sft"  # the label of the warm start's row and datasets, not a strategy name


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
    conf_source = conf_source or project_root() / settings.CONF_SOURCE
    loader_args = {"base_env": "base", "default_run_env": "local"}
    loader_args.update({k: v for k, v in settings.CONFIG_LOADER_ARGS.items() if k in loader_args})
    loader = OmegaConfigLoader(str(conf_source), env=os.environ.get("KEDRO_ENV"), **loader_args)
    strategies = (loader["parameters"].get(group) or {}).get("strategies") or {}
    if not strategies:
        raise ValueError(
            f"no strategies under {group}.strategies in {conf_source}/*/parameters_{group}.yml; "
            "list at least one"
        )
    bad = [name for name in strategies if not STRATEGY_NAME.fullmatch(str(name))]
    if bad:
        raise ValueError(
            f"strategy names {bad} under {group}.strategies cannot be Kedro namespaces: use "
            "letters, digits and underscores (a '.' would nest namespaces)"
        )
    if WARM_START in strategies:
        raise ValueError(
            f"{group}.strategies may not define {WARM_START!r}: it names the warm start's "
            f"datasets ({group}_results_{WARM_START}, ...); rename the strategy"
        )
    return list(strategies)


# Catalog names of each strategy's datasets (``{group}``: the pipeline, ``{strategy}``: its
# name), the same for every comparison.
STRATEGY_DATASETS = {
    "checkpoints": "{group}_checkpoints_{strategy}",
    "policy": "{group}_policy_{strategy}",
    "metrics": "{group}_{strategy}_metrics",
    "samples": "{group}_samples_{strategy}",
    "results": "{group}_results_{strategy}",
}


def strategy_template(
    group: str,
    train: Callable,
    evaluate: Callable,
    train_inputs: Sequence[str],
    evaluation_inputs: Sequence[str],
) -> Pipeline:
    """Train one strategy from the warm start, then evaluate it.

    ``train(*train_inputs, checkpoints, params, strategy) -> (policy, metrics, samples)``, where
    ``strategy`` is the strategy's overrides of ``params['grpo']``;
    ``evaluate(policy, *evaluation_inputs) -> results``.
    """
    params = f"params:{group}"
    return Pipeline(
        [
            Node(
                train,
                [*train_inputs, "checkpoints", params, "params:strategy"],
                ["policy", "metrics", "samples"],
                name=f"train_{group}_policy",
            ),
            Node(
                evaluate, ["policy", *evaluation_inputs], "results", name=f"evaluate_{group}_policy"
            ),
        ]
    )


def comparison_pipeline(
    group: str,
    strategies: Sequence[str],
    train: Callable,
    evaluate: Callable,
    compare: Callable,
    train_inputs: Sequence[str],
    evaluation_inputs: Sequence[str],
) -> Pipeline:
    """``strategy_template`` once per strategy, namespaced by the strategy's name, then the
    comparison node.

    Every strategy reads ``train_inputs`` and ``evaluation_inputs`` (the warm start, the
    tasks, ...) under their own names, ``params:<group>``, and ``params:strategy`` mapped to
    ``params:<group>.strategies.<name>``; its outputs get the stable ``STRATEGY_DATASETS``
    names, so ``--load-versions`` examples and the docs keep their names.
    ``compare(params, <group>_results_sft, **{"results/<name>": ..., "metrics/<name>": ...})
    -> (<group>_comparison, <group>_reward_curves)``.
    """
    template = strategy_template(group, train, evaluate, train_inputs, evaluation_inputs)
    shared = {d: d for d in template.inputs() if not d.startswith("params:") and d != "checkpoints"}

    def named(dataset: str, name: str) -> str:
        return STRATEGY_DATASETS[dataset].format(group=group, strategy=name)

    instances = [
        pipeline(
            template,
            namespace=name,
            inputs={**shared, "checkpoints": named("checkpoints", name)},
            outputs={d: named(d, name) for d in ("policy", "metrics", "samples", "results")},
            parameters={
                f"params:{group}": f"params:{group}",
                "params:strategy": f"params:{group}.strategies.{name}",
            },
        )
        for name in strategies
    ]
    warm_start = f"{group}_results_{WARM_START}"
    inputs = {"params": f"params:{group}", warm_start: warm_start}
    for name in strategies:
        inputs[RESULTS_PREFIX + name] = named("results", name)
        inputs[METRICS_PREFIX + name] = named("metrics", name)
    report = Node(
        compare,
        inputs,
        [f"{group}_comparison", f"{group}_reward_curves"],
        name=f"compare_{group}_strategies",
    )
    return Pipeline([*instances, report])


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
    _check_built(configured, names)
    evaluations = [warm_start.assign(policy=WARM_START)]
    evaluations += [tables[RESULTS_PREFIX + n].assign(policy=n) for n in names]
    metrics = [tables[METRICS_PREFIX + n].assign(strategy=n) for n in names]
    return pd.concat(evaluations, ignore_index=True), pd.concat(metrics, ignore_index=True)


def _check_built(configured: Mapping[str, object], built: Sequence[str]) -> None:
    missing = sorted(set(configured) - set(built))
    if missing:
        raise ValueError(
            f"strategies {missing} are in the parameters but not in the pipeline: the strategy "
            "list is read from conf/base and conf/local (or $KEDRO_ENV) when the pipeline is "
            "built, so --params and --env cannot add one; add it to those parameter files"
        )


def check_strategies(
    pipeline: Pipeline, group_params: Callable[[str], Mapping[str, object] | None]
) -> None:
    """Before a run, with the run's parameters (``--params`` and ``--env`` applied; read with
    ``group_params(group)``, None when the group has none):

    - every strategy the run trains builds its configs (``grpo_runs.check_comparison_params``:
      the SFT config and the strategy's GRPO config), so a typo fails in seconds;
    - for each comparison node the run includes, every strategy under ``<group>.strategies``
      has its namespace in ``pipeline``.

    Raises:
        ConfigError / ValueError: naming the strategy and the key, or the missing strategies.
    """
    trained: dict[str, set[str]] = {}  # group -> strategies whose nodes the run includes
    compared: dict[str, list[str]] = {}  # group -> strategies its comparison node reads
    for node in pipeline.nodes:
        for dataset in node.inputs:
            if match := re.fullmatch(r"params:(\w+)\.strategies\.(\w+)", dataset):
                trained.setdefault(match.group(1), set()).add(match.group(2))
        if match := re.fullmatch(r"compare_(\w+)_strategies", node.name):
            prefix = f"{match.group(1)}_results_"
            compared[match.group(1)] = [
                d[len(prefix) :] for d in node.inputs if d.startswith(prefix)
            ]
    for group in sorted(trained.keys() | compared.keys()):
        if not (params := group_params(group)):
            continue
        if group in trained:
            check_comparison_params(group, dict(params), sorted(trained[group]))
        if group in compared:
            _check_built(params.get("strategies") or {}, compared[group])
