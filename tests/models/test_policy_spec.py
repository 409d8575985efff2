"""The one policy-spec loader behind ``load_policy`` and ``load_policy``: validation of a
``{source: tiny | pretrained, ...}`` spec, and the weights each loader builds from it.

The stored digests were computed with the loaders as they were before ``PolicySpec`` existed
(two copies of the spec parsing, one in ``builders.py`` and one in ``vision.py``), under torch
2.13 / transformers 5.24 on CPU; a change in either library's initialisation changes them too.
"""

import hashlib
import inspect
import typing
from dataclasses import fields

import pytest
import torch

from creditflow.config.policy import DTYPE_NAMES, PolicySpec, TinyQwen2, TinyQwen2_5VL
from creditflow.models import (
    build_tiny_processor,
    build_tiny_qwen2,
    build_tiny_qwen2_5_vl,
    load_policy,
    train_vl_tokenizer,
)
from creditflow.models.builders import DTYPES, from_pretrained_kwargs

VL_CORPUS = [
    "Look at the image and answer the question. Put the final answer in \\boxed{}.",
    "How many red circles plus blue squares are there?",
    "What is the height of bar B minus the height of bar A?",
    "Add the two numbers in the picture.",
    "2 red circles + 3 blue squares = 5. The answer is \\boxed{5}",
    "Bar B is 7 and bar A is 3. 7 - 3 = 4. The answer is \\boxed{4}",
]
TINY_TEXT = {"source": "tiny", "tiny": {"hidden_size": 32, "num_hidden_layers": 1, "seed": 3}}
TINY_VL = {"source": "tiny", "tiny": {"hidden_size": 32, "vision_depth": 1, "seed": 3}}


def state_digest(model) -> str:
    """16 hex digits of every state_dict entry's name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def processor():
    return build_tiny_processor(train_vl_tokenizer(VL_CORPUS * 10, vocab_size=400), image_size=112)


def test_text_policies_have_the_weights_they_had_before_the_shared_loader(tokenizer, tmp_path):
    model, _ = load_policy(TINY_TEXT, processing_class=tokenizer)
    assert state_digest(model) == "925a73a155554b83"
    model, _ = load_policy({"source": "tiny"}, processing_class=tokenizer)
    assert state_digest(model) == "3e6f4942ce0dfd2e"
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_policy({"source": "pretrained", "name_or_path": tmp_path, "dtype": "bfloat16"})
    assert loaded.dtype == torch.bfloat16 and state_digest(loaded) == "5fb0c22a11fddda2"


def test_vl_policies_have_the_weights_they_had_before_the_shared_loader(processor, tmp_path):
    model, _ = load_policy(TINY_VL, processing_class=processor)
    assert state_digest(model) == "5004d1c9caf1cf61"
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded, proc = load_policy(
        {"source": "pretrained", "name_or_path": tmp_path, "dtype": "bfloat16"}
    )
    assert loaded.dtype == torch.bfloat16 and state_digest(loaded) == "26db4064b664fa45"
    assert proc.tokenizer.padding_side == "left"


def test_from_params_fills_the_pretrained_defaults():
    spec = PolicySpec.from_params(
        {"source": "pretrained", "name_or_path": "org/model"}, tiny_options=(), example_id="x"
    )
    assert spec == PolicySpec(source="pretrained", name_or_path="org/model")
    assert from_pretrained_kwargs(spec) == {"dtype": DTYPES["auto"], "trust_remote_code": False}
    eager = PolicySpec.from_params(
        {
            "source": "pretrained",
            "name_or_path": "m",
            "dtype": "bfloat16",
            "attn_implementation": "eager",
        },
        tiny_options=(),
        example_id="x",
    )
    assert from_pretrained_kwargs(eager) == {
        "dtype": torch.bfloat16,
        "trust_remote_code": False,
        "attn_implementation": "eager",
    }


def test_from_params_keeps_the_tiny_options_and_checks_their_names():
    spec = PolicySpec.from_params(
        {"source": "tiny", "tiny": {"seed": 1}}, tiny_options=("seed",), example_id="x"
    )
    assert spec == PolicySpec(source="tiny", tiny={"seed": 1})
    assert PolicySpec.from_params({"source": "tiny"}, tiny_options=(), example_id="x").tiny == {}
    with pytest.raises(
        ValueError, match=r"unknown keys \['width'\] under 'tiny'; valid: \['seed'\]"
    ):
        PolicySpec.from_params(
            {"source": "tiny", "tiny": {"width": 2}}, tiny_options=("seed",), example_id="x"
        )


def test_the_settings_of_the_other_source_are_ignored():
    # conf/base's `tiny:` block stays when an override switches the source to pretrained.
    tiny = {"seed": 1, "width": 2}  # not checked either: a tiny model is not built
    spec = PolicySpec.from_params(
        {"source": "pretrained", "name_or_path": "org/model", "tiny": tiny},
        tiny_options=("seed",),
        example_id="x",
    )
    assert spec == PolicySpec(source="pretrained", name_or_path="org/model")
    # And the reverse: a pretrained block's keys beside source: tiny.
    spec = PolicySpec.from_params(
        {
            "source": "tiny",
            "name_or_path": "org/model",
            "trust_remote_code": True,
            "attn_implementation": "sdpa",
        },
        tiny_options=(),
        example_id="x",
    )
    assert spec == PolicySpec(source="tiny")
    with pytest.raises(ValueError, match=r"unknown keys \['revison'\] for policy source 'tiny'"):
        PolicySpec.from_params(
            {"source": "tiny", "name_or_path": "org/model", "revison": "main"},
            tiny_options=(),
            example_id="x",
        )


def test_a_missing_name_or_path_names_the_example_id():
    with pytest.raises(ValueError, match="e.g. 'org/example'"):
        PolicySpec.from_params({"source": "pretrained"}, tiny_options=(), example_id="org/example")


@pytest.mark.parametrize(
    ("options", "builder", "taken"),
    [
        (TinyQwen2, build_tiny_qwen2, "tokenizer"),
        (TinyQwen2_5VL, build_tiny_qwen2_5_vl, "processor_or_tokenizer"),
    ],
)
def test_the_torch_free_tiny_options_are_the_builders_keyword_arguments(options, builder, taken):
    # config.policy keeps a copy of each builder's options so that the parameter check needs
    # no torch; same names, types and defaults as the signature.
    hints = typing.get_type_hints(builder)
    expected = {
        name: (hints[name], p.default)
        for name, p in inspect.signature(builder).parameters.items()
        if name != taken
    }
    hints = typing.get_type_hints(options)
    assert {f.name: (hints[f.name], f.default) for f in fields(options)} == expected


def test_the_torch_free_dtype_names_are_the_loaders_dtypes():
    assert DTYPE_NAMES == tuple(DTYPES)
