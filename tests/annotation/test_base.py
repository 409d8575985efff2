"""Annotator registry: names, options, errors."""

import pytest

from creditflow.annotation import (
    ANNOTATORS,
    Annotator,
    HeuristicAnnotator,
    OpenAIAnnotator,
    build_annotator,
)


def test_registry_builds_each_annotator():
    assert set(ANNOTATORS) == {"heuristic", "hf", "openai"}
    heuristic = build_annotator("heuristic")
    assert isinstance(heuristic, HeuristicAnnotator) and isinstance(heuristic, Annotator)
    client = build_annotator("openai", base_url="http://127.0.0.1:9", model="m", max_retries=0)
    assert isinstance(client, OpenAIAnnotator) and isinstance(client, Annotator)
    assert client.max_retries == 0 and client.model == "m"


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown annotator 'vllm'; valid: heuristic, hf, openai"):
        build_annotator("vllm")


def test_options_reach_the_constructor():
    with pytest.raises(TypeError):
        build_annotator("heuristic", temperature=0.0)
