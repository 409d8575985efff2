"""Where the openai annotator's key comes from: a named Kedro credentials entry, else
OPENAI_API_KEY, never parameters; and the annotate_items node failing before any request."""

import logging

import pytest
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from creditflow.chain.annotation.credentials import resolve_annotator_options
from creditflow.errors import ConfigError
from creditflow.pipelines.annotation import create_pipeline

OPTIONS = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
CREDENTIALS = {"openai_annotator": {"api_key": "key-from-credentials"}, "other": {"x": 1}}


def test_named_entry_supplies_the_key_and_wins_over_the_environment():
    options = {**OPTIONS, "credentials": "openai_annotator"}
    environ = {"OPENAI_API_KEY": "key-from-env"}
    resolved = resolve_annotator_options("openai", options, CREDENTIALS, environ)
    assert resolved == {**OPTIONS, "api_key": "key-from-credentials"}
    assert "credentials" in options  # the parameters are not changed in place


def test_environment_is_the_fallback_and_no_key_warns(caplog):
    environ = {"OPENAI_API_KEY": "key-from-env"}
    assert resolve_annotator_options("openai", OPTIONS, {}, environ)["api_key"] == "key-from-env"
    with caplog.at_level(logging.WARNING):
        resolved = resolve_annotator_options("openai", OPTIONS, CREDENTIALS, {})
    assert resolved["api_key"] is None
    assert "no Authorization header" in caplog.text and "OPENAI_API_KEY" in caplog.text


@pytest.mark.parametrize("name", ["api_key", "token", "apiKey"])
def test_a_key_in_parameters_is_refused_without_echoing_it(name):
    with pytest.raises(
        ConfigError, match=rf"options\.{name}: .*conf/local/credentials.yml"
    ) as info:
        resolve_annotator_options("openai", {**OPTIONS, name: "sk-in-params-123"}, {}, {})
    assert "sk-in-params-123" not in str(info.value)


def test_a_missing_or_keyless_entry_names_the_entry_and_the_file():
    missing = {**OPTIONS, "credentials": "openai_anotator"}  # misspelt
    with pytest.raises(
        ConfigError,
        match=r"'openai_anotator', which is not an entry .*conf/local/credentials.yml.*"
        r"entries found: openai_annotator, other",
    ):
        resolve_annotator_options("openai", missing, CREDENTIALS, {})
    with pytest.raises(ConfigError, match=r"entry 'other' .*needs a non-empty string 'api_key'"):
        resolve_annotator_options("openai", {**OPTIONS, "credentials": "other"}, CREDENTIALS, {})


def test_annotators_without_a_key_take_no_credentials():
    assert resolve_annotator_options("heuristic", {}, CREDENTIALS, {}) == {}
    with pytest.raises(ConfigError, match="'heuristic' annotator sends no key"):
        resolve_annotator_options("heuristic", {"credentials": "openai_annotator"}, {}, {})


def test_annotate_items_fails_before_annotating_on_a_missing_entry(catalogue):
    params = {"annotator": {"name": "openai", "options": {**OPTIONS, "credentials": "nope"}}}
    pipeline = create_pipeline().only_nodes("annotate_items")
    catalog = DataCatalog(
        {
            "catalogue_items": MemoryDataset(catalogue.head(2)),
            "params:annotation": MemoryDataset(params),
            "credentials": MemoryDataset(CREDENTIALS),
            "item_annotations": MemoryDataset(),
        }
    )
    # Annotating an unreachable server would give failed rows, not an error: this is raised
    # before the first request.
    with pytest.raises(ConfigError, match="'nope', which is not an entry .*credentials.yml"):
        SequentialRunner().run(pipeline, catalog)
