"""Annotator registry: names, options, errors."""

import inspect
import typing

import pytest

from creditflow.chain.annotation import HeuristicAnnotator, OpenAIAnnotator
from creditflow.chain.annotation.base import ANNOTATORS, Annotator, build_annotator
from creditflow.chain.annotation.hf_backend import HFAnnotator
from creditflow.chain.annotation.options import ANNOTATOR_OPTIONS, HFOptions


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


def test_each_annotators_options_are_its_constructors_arguments():
    # annotation.options checks the options without torch (the hf backend's module imports it):
    # same names, kinds, types and defaults as each annotator's own arguments.
    assert list(ANNOTATOR_OPTIONS) == list(ANNOTATORS)
    assert ANNOTATORS["hf"] is HFAnnotator and ANNOTATOR_OPTIONS["hf"] is HFOptions
    for name, annotator in ANNOTATORS.items():
        options = ANNOTATOR_OPTIONS[name]
        hints = typing.get_type_hints(annotator.__init__)
        option_hints = typing.get_type_hints(options.__init__ if options is annotator else options)
        expected = [
            (p.name, p.kind, p.default, hints[p.name])
            for p in inspect.signature(annotator).parameters.values()
        ]
        got = [
            (p.name, p.kind, p.default, option_hints[p.name])
            for p in inspect.signature(options).parameters.values()
        ]
        assert got == expected, name


def test_the_hf_annotator_checks_its_options_as_the_parameter_check_does():
    with pytest.raises(ValueError, match="give exactly one model source") as direct:
        HFAnnotator(model_name_or_path="m", spec={"source": "tiny"})
    with pytest.raises(ValueError, match="give exactly one model source") as checked:
        HFOptions(model_name_or_path="m", spec={"source": "tiny"})
    assert str(direct.value) == str(checked.value)
    with pytest.raises(ValueError, match="retry_temperature must be > 0"):
        HFOptions(model_name_or_path="m", retry_temperature=0.0)
