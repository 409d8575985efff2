"""Per-strategy comparisons as Kedro modular pipelines (the ``tapo``, ``tor`` and ``grpo``
pipelines), each built by ``world_pipeline`` from a ``ComparisonWorld``: what its tasks,
tokenizer (or processor), policy, warm start, evaluation and report are. The same node names
in each: ``build_<group>_tasks``, ``train_<group>_tokenizer`` (or ``_processor``),
``build_<group>_policy``, ``warm_start_<group>_policy``, ``evaluate_<group>_policy_sft``,
then per strategy ``train_<group>_policy`` / ``evaluate_<group>_policy`` (each over the seeds)
and ``compare_<group>_strategies``.

One template (train -> evaluate, written once per pipeline) is instantiated with
``pipeline(template, namespace=strategy)`` for every strategy listed under
``<group>.strategies`` in ``conf/<env>/parameters_<group>.yml``. Adding a strategy is a YAML
change; kedro-viz shows each strategy as a collapsible group, and
``kedro run --pipelines tapo --namespaces tapo`` runs one strategy's train and evaluate from
the stored warm start.

The strategy list is read when the pipeline is built, from the configuration files (base,
then the ``KEDRO_ENV`` environment, ``local`` by default): Kedro builds pipelines before it
knows ``--params`` or ``--env``, so those can change a listed strategy's settings but cannot
add one. ``check_strategies`` (run by ``hooks.parameter_check.ParameterCheckHook`` before the first node)
then fails the run, saying so, instead of leaving the strategy out silently.

Seeds are a loop inside each strategy's two nodes, not namespaces: the train node
runs the strategy's GRPO ``<group>.comparison.n_seeds`` times from the one warm start, run k
with GRPO seed ``grpo.seed + k`` (``seed_overrides``), and the evaluate node evaluates each
of those policies (``train_each_seed`` / ``evaluate_each_seed``). Why not a namespace per
seed: the namespaces are fixed when the pipeline is built, before ``--params``, and an
environment's parameter file replaces a whole group (Kedro merges parameters across
environments key by key at the top level), so a seed count read at build time could only be
changed by editing ``conf/base``; as a loop it is a run-time knob
(``--params tapo.comparison.n_seeds=5``). The DAG also stays one train and one evaluate node
per strategy, whatever the count (5 strategies x 5 seeds would be 50 nodes in kedro-viz). The
cost: a strategy's seeds run one after another in one node. Each seed's run keeps its own
resumable checkpoints (the run's fingerprint covers its config, seed included), so a
stopped multi-seed run resumes at the seed it stopped in. The policies travel as ``{seed:
model}`` (``creditflow.datasets.HFModelsBySeedDataset``), metrics, samples and evaluations
with a ``seed`` column; the comparison node writes a per-seed table and the table over seeds
with intervals (``creditflow.reporting.stats``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
from kedro.config import OmegaConfigLoader
from kedro.framework.project import settings
from kedro.pipeline import Node, Pipeline, pipeline

from creditflow import tracking
from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError
from creditflow.reporting.credit import credit_html, plot_credit
from creditflow.training.grpo_runs import check_comparison_params

logger = logging.getLogger(__name__)

RESULTS_PREFIX, METRICS_PREFIX, CREDIT_PREFIX = "results/", "metrics/", "credit/"
STRATEGY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a namespace and a dataset-name part
WARM_START = "sft"  # the label of the warm start's row and datasets, not a strategy name
# The tag of a train node whose policy has a no-image pass: the parameter check reads it, so
# the engine never needs to know which pipeline trains a vision-language policy.
IMAGE_PASS_TAG = "policy_with_image_pass"


def project_root() -> Path:
    """The Kedro project this code runs in: the nearest folder at or above the working
    directory whose ``pyproject.toml`` declares ``[tool.kedro]``, else this checkout's root."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "[tool.kedro]" in pyproject.read_text(encoding="utf-8"):
            return folder
    return Path(__file__).resolve().parents[3]


def active_strategies(strategies: Mapping[str, Any] | None) -> dict[str, Any]:
    """The strategies of a ``<group>.strategies`` mapping that run: all but those set to null.
    An environment's parameters merge into base's key by key and cannot delete a key, so
    ``name: null`` there is how it leaves one of base's strategies out.

    >>> active_strategies({"grpo": {"advantage": {"name": "grpo"}}, "dr_grpo": None})
    {'grpo': {'advantage': {'name': 'grpo'}}}
    """
    return {name: spec for name, spec in (strategies or {}).items() if spec is not None}


def configured_strategies(
    group: str, conf_source: str | Path | None = None, env: str | None = None
) -> list[str]:
    """The strategy names under ``<group>.strategies`` in the project's parameters (base, then
    ``env``, by default the ``KEDRO_ENV`` environment variable's, else ``local``), in file
    order. Raises ValueError when there are none."""
    conf_source = conf_source or project_root() / settings.CONF_SOURCE
    # The project's merge strategy too (settings.py; also where the project's settings are not
    # loaded, as in the tests): a conf/local file of a few tapo keys merges into base and
    # leaves base's strategies in place, and conf/tor_ablations adds strategies to base's.
    loader_args = {
        "base_env": "base",
        "default_run_env": "local",
        "merge_strategy": {"parameters": "soft"},
    }
    loader_args.update({k: v for k, v in settings.CONFIG_LOADER_ARGS.items() if k in loader_args})
    env = env or os.environ.get("KEDRO_ENV")
    loader = OmegaConfigLoader(str(conf_source), env=env, **loader_args)
    strategies = active_strategies((loader["parameters"].get(group) or {}).get("strategies"))
    if not strategies:
        raise ValueError(
            f"no strategies under {group}.strategies in {conf_source}/*/parameters_{group}.yml "
            "(or all of them set to null); list at least one"
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
    "policies": "{group}_policies_{strategy}",  # {seed: model}
    "metrics": "{group}_{strategy}_metrics",
    "samples": "{group}_samples_{strategy}",
    "results": "{group}_results_{strategy}",
    "credit": "{group}_credit_{strategy}",  # the credit inspector's token rows
}


# ---------------------------------------------------------------- seeds
# (model, metrics, samples, credit) of one GRPO run: what a pipeline's one-seed train function
# returns (credit: the credit inspector's token rows, creditflow.training.credit).
Trained = tuple[Any, pd.DataFrame, pd.DataFrame, pd.DataFrame]
SEED = "seed"  # the column naming the GRPO seed in metrics, samples and evaluations


def seed_overrides(
    params: Mapping[str, Any], strategy: Mapping[str, Any]
) -> list[tuple[int, dict[str, Any]]]:
    """``(seed, overrides)`` of each GRPO run of one strategy: ``comparison.n_seeds`` runs,
    run k with GRPO seed s + k, s the strategy's seed (its own ``seed`` override, else
    ``grpo.seed``); ``overrides`` are the strategy's with that seed. With one seed the config
    is the strategy's own, so its checkpoints are those of a run before seeds existed.

    >>> params = {"comparison": {"n_seeds": 3}, "grpo": {"seed": 7}}
    >>> [seed for seed, _ in seed_overrides(params, {})], seed_overrides(params, {"seed": 1})[1]
    ([7, 8, 9], (2, {'seed': 2}))
    """
    n_seeds = params["comparison"]["n_seeds"]
    first = {**params["grpo"], **strategy}.get("seed", GRPOConfig.default("seed"))
    return [(first + k, {**strategy, "seed": first + k}) for k in range(n_seeds)]


def train_each_seed(
    train: Callable[[dict[str, Any], dict[str, Any]], tuple[Any, ...]],
    params: dict[str, Any],
    strategy: dict[str, Any],
) -> tuple[Any, ...]:
    """``train(params, overrides)`` once per seed of ``seed_overrides``, from the same
    inputs (the warm start: ``train`` copies it); ``train`` returns ``(model, *tables)``
    (``Trained``: metrics, samples, credit). Returns ``({seed: model}, *tables)``, each table
    the runs' concatenated with a ``seed`` column first."""
    runs = seed_overrides(params, strategy)
    policies, tables = {}, []
    for index, (seed, overrides) in enumerate(runs, start=1):
        if len(runs) > 1:
            logger.info("GRPO seed %d (%d of %d)", seed, index, len(runs))
        with _seed_steps(seed) if len(runs) > 1 else nullcontext():
            model, *run_tables = train(params, overrides)
        policies[seed] = model
        tables.append([_with_seed(table, seed) for table in run_tables])
    return policies, *(pd.concat(column, ignore_index=True) for column in zip(*tables, strict=True))


def evaluate_each_seed(
    policies: Mapping[int, Any], evaluate: Callable[[Any], pd.DataFrame]
) -> pd.DataFrame:
    """``evaluate(model)`` for each seed's policy of ``{seed: model}``, concatenated with a
    ``seed`` column first."""
    tables = [_with_seed(evaluate(model), seed) for seed, model in policies.items()]
    return pd.concat(tables, ignore_index=True)


def seeds_trained(train_policy: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[Any, ...]]:
    """The strategy's train node: ``train_policy(warm start, text side, train tasks,
    checkpoints, params, strategy) -> (model, metrics, samples, credit)`` (one GRPO run) once
    per seed (``train_each_seed``), returning ``({seed: model}, metrics, samples, credit)``."""

    def train_policies(
        sft_policy: Any,
        text_side: Any,
        train_tasks: pd.DataFrame,
        checkpoints: Any,
        params: dict[str, Any],
        strategy: dict[str, Any],
    ) -> tuple[Any, ...]:
        train = partial(train_policy, sft_policy, text_side, train_tasks, checkpoints)
        return train_each_seed(train, params, strategy)

    return _named(train_policies, train_policy, "once per GRPO seed")


def seeds_evaluated(evaluate: Callable[..., pd.DataFrame]) -> Callable[..., pd.DataFrame]:
    """The strategy's evaluate node: ``evaluate(model, *inputs)`` for each seed's policy of
    ``{seed: model}`` (``evaluate_each_seed``), the rows with a ``seed`` column."""

    def evaluate_policies(policies: Mapping[int, Any], *inputs: Any) -> pd.DataFrame:
        return evaluate_each_seed(policies, lambda model: evaluate(model, *inputs))

    return _named(evaluate_policies, evaluate, "for each seed's policy")


def _named(node_function: Callable, one_run: Callable, how: str) -> Callable:
    """``node_function`` named and described after the one-run function it loops, so logs
    and kedro-viz show ``train_tapo_policy`` rather than a template's inner name."""
    node_function.__name__ = node_function.__qualname__ = one_run.__name__
    node_function.__module__ = one_run.__module__
    node_function.__doc__ = f"``{one_run.__name__}`` {how}.\n\n{one_run.__doc__ or ''}"
    return node_function


def _with_seed(table: pd.DataFrame, seed: int) -> pd.DataFrame:
    table = table.copy()
    table.insert(0, SEED, seed)
    return table


@contextmanager
def _seed_steps(seed: int) -> Iterator[None]:
    """The live MLflow metrics of one seed's run under ``<prefix>/seed_<seed>/``: the runs of
    one node would otherwise log steps 1..N under the same keys."""
    active = tracking.active_step_logger()
    if active is None:
        yield
        return
    prefix = f"{active.prefix}/seed_{seed}" if active.prefix else f"seed_{seed}"
    with tracking.logging_steps(dataclasses.replace(active, prefix=prefix)):
        yield


def strategy_template(
    group: str,
    train: Callable,
    evaluate: Callable,
    train_inputs: Sequence[str],
    evaluation_inputs: Sequence[str],
    image_pass: bool = False,
) -> Pipeline:
    """Train one strategy from the warm start once per seed, then evaluate each seed's policy.
    ``image_pass``: the policy it trains has a no-image pass (a vision-language policy), said
    by the train node's ``IMAGE_PASS_TAG``.

    ``train(*train_inputs, checkpoints, params, strategy) -> (policies, metrics, samples,
    credit)``,
    where ``strategy`` is the strategy's overrides of ``params['grpo']`` and ``policies`` is
    ``{seed: model}`` (``train_each_seed``); ``evaluate(policies, *evaluation_inputs) ->
    results`` (``evaluate_each_seed``).
    """
    params = f"params:{group}"
    return Pipeline(
        [
            Node(
                train,
                [*train_inputs, "checkpoints", params, "params:strategy"],
                ["policies", "metrics", "samples", "credit"],
                name=f"train_{group}_policy",
                tags=[IMAGE_PASS_TAG] if image_pass else None,
            ),
            Node(
                evaluate,
                ["policies", *evaluation_inputs],
                "results",
                name=f"evaluate_{group}_policy",
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
    image_pass: bool = False,
) -> Pipeline:
    """``strategy_template`` once per strategy, namespaced by the strategy's name, then the
    comparison node. ``image_pass``: the trained policy has a no-image pass (vision-language),
    so strategies that call it (ToR's perception score) may be listed.

    Every strategy reads ``train_inputs`` and ``evaluation_inputs`` (the warm start, the
    tasks, ...) under their own names, ``params:<group>``, and ``params:strategy`` mapped to
    ``params:<group>.strategies.<name>``; its outputs get the stable ``STRATEGY_DATASETS``
    names, so ``--load-versions`` examples and the docs keep their names.
    ``compare(params, <group>_results_sft, **{"results/<name>": ..., "metrics/<name>": ...})
    -> (<group>_comparison, <group>_per_seed_comparison, <group>_reward_curves)``: the table
    over seeds (with intervals), one row per (policy, seed), and the curves; and
    ``render_token_credit`` of every strategy's ``<group>_credit_<name>`` table ->
    ``(<group>_token_credit_html, <group>_token_credit_plot)``.
    """
    template = strategy_template(
        group, train, evaluate, train_inputs, evaluation_inputs, image_pass
    )
    shared = {d: d for d in template.inputs() if not d.startswith("params:") and d != "checkpoints"}

    def named(dataset: str, name: str) -> str:
        return STRATEGY_DATASETS[dataset].format(group=group, strategy=name)

    instances = [
        pipeline(
            template,
            namespace=name,
            inputs={**shared, "checkpoints": named("checkpoints", name)},
            outputs={
                d: named(d, name) for d in ("policies", "metrics", "samples", "results", "credit")
            },
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
        [f"{group}_comparison", f"{group}_per_seed_comparison", f"{group}_reward_curves"],
        name=f"compare_{group}_strategies",
    )
    credit = Node(
        render_token_credit,
        {CREDIT_PREFIX + name: named("credit", name) for name in strategies},
        [f"{group}_token_credit_html", f"{group}_token_credit_plot"],
        name=f"render_{group}_token_credit",
    )
    return Pipeline([*instances, report, credit])


@dataclasses.dataclass(frozen=True)
class ComparisonWorld:
    """What one comparison pipeline trains on, as its nodes module provides it.

    Every function takes the datasets named below and ``params:<group>`` last:

    - ``build_tasks(<source dataset>, params) -> (<group>_train_tasks, <group>_eval_tasks)``;
    - ``train_tokenizer(<group>_train_tasks, params) -> <group>_<text_side>``: the tokenizer
      of a text policy, the processor (tokenizer and image processor) of a vision-language one;
    - ``build_policy(<group>_<text_side>, params) -> <group>_initial_policy``;
    - ``warm_start(initial policy, text side, train tasks, <group>_sft_checkpoints, params) ->
      (<group>_sft_policy, <group>_sft_metrics)``;
    - ``evaluate(policy, text side, eval tasks, *evaluation_extra, params) -> results``, for
      the warm start here and, once per seed (``seeds_evaluated``), for every strategy's
      policies;
    - ``train_policy(warm start, text side, train tasks, checkpoints, params, strategy) ->
      (model, metrics, samples, credit)``: one GRPO run, run once per seed
      (``seeds_trained``);
    - ``compare``: ``comparison_pipeline``'s.

    source: the dataset the tasks are read from (``config.task_sources.TASK_SOURCES``).
    image_pass: the policy has a no-image pass (vision-language), which ToR's perception
        score calls.
    """

    group: str
    source: str
    build_tasks: Callable
    train_tokenizer: Callable
    build_policy: Callable
    warm_start: Callable
    evaluate: Callable
    train_policy: Callable
    compare: Callable
    text_side: str = "tokenizer"
    evaluation_extra: tuple[str, ...] = ()
    image_pass: bool = False

    def dataset(self, name: str) -> str:
        return f"{self.group}_{name}"

    @property
    def evaluation_inputs(self) -> list[str]:
        return [
            self.dataset(self.text_side),
            self.dataset("eval_tasks"),
            *self.evaluation_extra,
            f"params:{self.group}",
        ]


def world_pipeline(world: ComparisonWorld, strategies: Sequence[str] | None = None) -> Pipeline:
    """The comparison pipeline of ``world`` over ``strategies`` (default: those of the
    parameters files): tasks -> tokenizer -> policy -> SFT warm start -> its evaluation, then
    ``comparison_pipeline``, tagged with the group's name."""
    group, d = world.group, world.dataset
    params = f"params:{group}"
    strategies = list(strategies or configured_strategies(group))
    text_side = d(world.text_side)
    setup = Pipeline(
        [
            Node(
                world.build_tasks,
                [world.source, params],
                [d("train_tasks"), d("eval_tasks")],
                name=f"build_{group}_tasks",
            ),
            Node(
                world.train_tokenizer,
                [d("train_tasks"), params],
                text_side,
                name=f"train_{group}_{world.text_side}",
            ),
            Node(
                world.build_policy,
                [text_side, params],
                d("initial_policy"),
                name=f"build_{group}_policy",
            ),
            Node(
                world.warm_start,
                [d("initial_policy"), text_side, d("train_tasks"), d("sft_checkpoints"), params],
                [d("sft_policy"), d("sft_metrics")],
                name=f"warm_start_{group}_policy",
            ),
            Node(
                world.evaluate,
                [d("sft_policy"), *world.evaluation_inputs],
                d(f"results_{WARM_START}"),
                name=f"evaluate_{group}_policy_{WARM_START}",
            ),
        ]
    )
    comparison = comparison_pipeline(
        group,
        strategies,
        seeds_trained(world.train_policy),
        seeds_evaluated(world.evaluate),
        world.compare,
        train_inputs=[d("sft_policy"), text_side, d("train_tasks")],
        evaluation_inputs=world.evaluation_inputs,
        image_pass=world.image_pass,
    )
    return Pipeline([setup, comparison], tags=[group])


def render_token_credit(**tables: pd.DataFrame) -> tuple[str, Any]:
    """The credit inspector's renderings of a comparison: the HTML page and the figure
    (``reporting.credit``) of the ``credit/<strategy>`` tables, in strategy order."""
    by_strategy = {key.removeprefix(CREDIT_PREFIX): table for key, table in tables.items()}
    return credit_html(by_strategy, title="Token credit by strategy"), plot_credit(by_strategy)


def labelled_tables(
    configured: Mapping[str, object], warm_start: pd.DataFrame, tables: Mapping[str, pd.DataFrame]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(evaluations, training metrics)`` of a comparison: the warm start's evaluation
    labelled ``policy="sft"``, each strategy's labelled with its name (``policy`` and
    ``strategy`` columns), concatenated in strategy order.

    Raises:
        ValueError: a strategy of the parameters has no tables in the pipeline (it was added
            with ``--params``, after the pipeline was built), or a strategy's table has no
            ``seed`` column (saved before seeds existed, e.g. loaded with ``--load-versions``).
    """
    names = [key[len(RESULTS_PREFIX) :] for key in tables if key.startswith(RESULTS_PREFIX)]
    _check_built(configured, names)
    unseeded = [key for key, table in tables.items() if SEED not in table.columns]
    if unseeded:
        raise ValueError(
            f"{sorted(unseeded)} have no {SEED!r} column: they were saved before the "
            "comparisons had seeds; rerun those strategies' train and evaluate nodes"
        )
    evaluations = [warm_start.assign(policy=WARM_START)]
    evaluations += [tables[RESULTS_PREFIX + n].assign(policy=n) for n in names]
    metrics = [tables[METRICS_PREFIX + n].assign(strategy=n) for n in names]
    return pd.concat(evaluations, ignore_index=True), pd.concat(metrics, ignore_index=True)


def _check_built(configured: Mapping[str, object], built: Sequence[str]) -> None:
    missing = sorted(set(active_strategies(configured)) - set(built))
    if missing:
        raise ConfigError(
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
    image_pass: set[str] = set()  # groups whose policy has a no-image pass
    for node in pipeline.nodes:
        for dataset in node.inputs:
            if match := re.fullmatch(r"params:(\w+)\.strategies\.(\w+)", dataset):
                trained.setdefault(match.group(1), set()).add(match.group(2))
                if IMAGE_PASS_TAG in node.tags:
                    image_pass.add(match.group(1))
        if match := re.fullmatch(r"compare_(\w+)_strategies", node.name):
            prefix = f"{match.group(1)}_results_"
            compared[match.group(1)] = [
                d[len(prefix) :] for d in node.inputs if d.startswith(prefix)
            ]
    for group in sorted(trained.keys() | compared.keys()):
        if not (params := group_params(group)):
            continue
        if group in trained:
            check_comparison_params(
                group, dict(params), sorted(trained[group]), has_image_pass=group in image_pass
            )
        if group in compared:
            _check_built(params.get("strategies") or {}, compared[group])
