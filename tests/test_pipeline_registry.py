"""A misspelt pipeline name fails in a few lines naming the closest pipeline and the valid ones,
not in a traceback through Kedro's loader."""

import click
import pytest

from creditflow.pipeline_registry import (
    UnknownPipelineError,
    check_requested_pipelines,
    pipeline_names,
)


def test_the_pipeline_names_are_the_pipeline_folders():
    names = pipeline_names()
    assert {"tapo", "tor", "grpo", "data_ingest", "reranker_grpo"} <= set(names)
    assert not any(name.startswith("_") for name in names)


def test_a_misspelt_pipeline_names_the_closest_and_the_valid_ones():
    with pytest.raises(UnknownPipelineError) as error:
        check_requested_pipelines(["tpao", "tor"])
    message = error.value.format_message()
    assert message.startswith("unknown pipeline `tpao` (did you mean `tapo`?); valid pipelines:")
    assert "data_ingest" in message and "`tor`" not in message
    # A usage error: the CLI prints "Error: <message>" and exits 2, without a traceback.
    assert isinstance(error.value, click.UsageError) and error.value.exit_code == 2


def test_known_and_default_pipelines_pass():
    check_requested_pipelines(None)
    check_requested_pipelines(["__default__", "tapo", "reranker_eval"])
