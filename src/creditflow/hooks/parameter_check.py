"""ParameterCheckHook: every parameter group a run reads is checked against its schema before the
first node; the ``--params`` overrides as soon as the context exists."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kedro.config import AbstractConfigLoader
from kedro.framework.hooks import hook_impl
from kedro.framework.project import settings
from kedro.io import CatalogProtocol
from kedro.pipeline import Pipeline

from creditflow.config.schema import check_override_groups
from creditflow.hooks.refusal import refuses
from creditflow.hooks.run_manifest import is_parameter_dataset

if TYPE_CHECKING:
    from kedro.framework.context import KedroContext


class ParameterCheckHook:
    """Fails a run before its first node when its parameters cannot work: every parameter
    group the run's nodes take is checked against its schema
    (:mod:`creditflow.pipelines.parameters`: unknown keys at any depth with a "did you mean",
    wrong types naming the key, ranges and cross-field rules), then the tapo / tor
    comparisons build the config of every strategy the run trains and check that no strategy
    of the parameters was left out of the pipeline (the strategy list is fixed when the
    pipeline is built, so one added with ``--params`` or ``--env`` would train nothing).

    The ``--params`` overrides are checked earlier, when the context is created: before the
    pipelines are imported, MLflow opens its store or the catalog is built. A top-level name
    that is no group of the conf (``tpao.grpo.steps=2``) fails with a "did you mean", and each
    group they name is checked whole against its schema, without importing torch. Whether
    this machine has a policy's ``device`` and whether page-level GRPO's strategies exist
    (torch) are asked before the first node only.

    All problems of all groups come in one ConfigError, in seconds, before anything trains.
    """

    @hook_impl
    @refuses
    def after_context_created(self, context: KedroContext) -> None:
        loader = context.config_loader
        overrides = loader.runtime_params or {}
        if not overrides:
            return
        check_override_groups(overrides, _conf_groups(loader))
        # Imported here: settings.py imports this module for every kedro command (kedro
        # --help), and the schemas take pydantic models and the task worlds' name tables
        # (pandas) to build. No schema imports torch, so a misspelt key fails here in seconds.
        from creditflow.pipelines.parameters import GROUPS, check_parameters  # noqa: PLC0415

        params = loader["parameters"]
        check_parameters({group: params[group] for group in overrides if group in GROUPS})

    @hook_impl
    @refuses
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        # Imported here: settings.py imports this module for every kedro command (kedro
        # --help, kedro viz), and the strategy checks and the device check pull in the
        # training engine (torch, transformers: seconds); by the time a run starts its
        # pipelines have imported it.
        from creditflow.models.builders import resolve_device  # noqa: PLC0415
        from creditflow.pipelines.comparison import check_strategies  # noqa: PLC0415
        from creditflow.pipelines.parameters import check_parameters  # noqa: PLC0415
        from creditflow.training.strategies import validate_strategies  # noqa: PLC0415

        def group_params(group: str) -> Mapping[str, Any] | None:
            name = f"params:{group}"
            return catalog.load(name) if name in catalog else None

        check_parameters(
            _parameter_groups(pipeline, catalog),
            check_device=resolve_device,
            validate_strategies=validate_strategies,
        )
        check_strategies(pipeline, group_params)


def _conf_groups(loader: AbstractConfigLoader) -> set[str]:
    """The top-level parameter groups of the conf files (base and the run's env), without the
    ``--params`` overrides, which the loader merges into what it returns."""
    plain = type(loader)(
        conf_source=loader.conf_source, env=loader.env, **settings.CONFIG_LOADER_ARGS
    )
    return set(plain["parameters"])


def _parameter_groups(pipeline: Pipeline, catalog: CatalogProtocol) -> dict[str, Any]:
    """The top-level parameter groups the pipeline's nodes read (``params:tapo`` and
    ``params:tapo.strategies.tapo`` both read ``tapo``; ``parameters`` reads all), as the
    catalog holds them (overrides applied)."""
    inputs = pipeline.inputs()
    if "parameters" in inputs and "parameters" in catalog:
        return dict(catalog.load("parameters"))
    groups = {
        name.removeprefix("params:").split(".")[0] for name in inputs if is_parameter_dataset(name)
    }
    return {
        group: catalog.load(f"params:{group}")
        for group in sorted(groups)
        if f"params:{group}" in catalog
    }
