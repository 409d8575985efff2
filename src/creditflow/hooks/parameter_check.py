"""ParameterCheckHook: every parameter group a run reads is checked against its schema before the
first node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kedro.framework.hooks import hook_impl
from kedro.io import CatalogProtocol
from kedro.pipeline import Pipeline

if TYPE_CHECKING:
    pass
from creditflow.hooks.run_manifest import is_parameter_dataset


class ParameterCheckHook:
    """Fails a run before its first node when its parameters cannot work: every parameter
    group the run's nodes take is checked against its schema
    (:mod:`creditflow.pipelines.parameters`: unknown keys at any depth with a "did you mean",
    wrong types naming the key, ranges and cross-field rules), then the tapo / tor
    comparisons build the config of every strategy the run trains and check that no strategy
    of the parameters was left out of the pipeline (the strategy list is fixed when the
    pipeline is built, so one added with ``--params`` or ``--env`` would train nothing).

    All problems of all groups come in one ConfigError, in seconds, before anything trains.
    """

    @hook_impl
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        # Imported here: settings.py imports this module for every kedro command (kedro
        # --help, kedro viz), and the checks pull in the training engine (torch,
        # transformers: ~3 s); by the time a run starts its pipelines have imported it.
        from creditflow.pipelines.comparison import check_strategies  # noqa: PLC0415
        from creditflow.pipelines.parameters import check_parameters  # noqa: PLC0415

        def group_params(group: str) -> Mapping[str, Any] | None:
            name = f"params:{group}"
            return catalog.load(name) if name in catalog else None

        check_parameters(_parameter_groups(pipeline, catalog))
        check_strategies(pipeline, group_params)


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
