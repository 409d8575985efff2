"""``policy.lora``: the spec's checks, and the adapters ``load_policy`` / ``load_policy`` add
(frozen base, trainable adapters that start by changing nothing, seeded)."""

import logging

import pytest
import torch

from creditflow.config.policy import ALL_LINEAR, LoraSpec
from creditflow.config.schema import problems
from creditflow.models import load_policy
from creditflow.models.lora import adapter_state_dict, is_lora_model, peft_config
from creditflow.pipelines.chain_parameters import ExpmodelModel
from creditflow.pipelines.parameters import TextPolicy
from tests.models.test_policy_spec import TINY_TEXT, TINY_VL, processor  # noqa: F401 - fixture

pytest.importorskip("peft")

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def test_from_params_fills_the_defaults_and_builds_the_peft_config():
    spec = LoraSpec.from_params(LORA)
    assert spec == LoraSpec(r=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
    assert (spec.dropout, spec.seed) == (0.0, 0)
    config = peft_config(LoraSpec.from_params({**LORA, "dropout": 0.1}))
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8.0, 0.1)
    assert config.target_modules == {"q_proj", "v_proj"}
    assert LoraSpec.from_params({**LORA, "target_modules": "all-linear"}).target_modules == (
        "all-linear"
    )


@pytest.mark.parametrize(
    ("lora", "match"),
    [
        ({"alpha": 8, "target_modules": ["q_proj"]}, "lora needs its rank r"),
        ({**LORA, "r": 0}, "lora r must be an integer >= 1, got 0"),
        ({**LORA, "r": 2.5}, "lora r must be an integer"),
        ({**LORA, "alpha": 0}, "lora alpha must be a number > 0"),
        ({**LORA, "dropout": 1.0}, r"lora dropout must be in \[0, 1\)"),
        ({**LORA, "target_modules": []}, "non-empty list of module names"),
        ({**LORA, "target_modules": ["q_proj", ""]}, "non-empty list of module names"),
        ({**LORA, "rank": 8}, r"unknown lora keys \['rank'\]"),
        ({**LORA, "target_modules": ["no_such_proj"]}, "do not fit Qwen2ForCausalLM"),
        ("q_proj", "lora must be a mapping"),
    ],
)
def test_a_bad_lora_block_fails_naming_the_key(tokenizer, lora, match):
    with pytest.raises(ValueError, match=match):
        load_policy({**TINY_TEXT, "lora": lora}, processing_class=tokenizer)


def test_the_parameter_schema_checks_the_lora_block():
    spec = {"source": "tiny", "lora": {"r": 4, "alpah": 8, "target_modules": ["q_proj"]}}
    assert problems("tapo.policy", spec, TextPolicy) == [
        "tapo.policy.lora: unknown key `alpah` (did you mean `alpha`?); valid keys: alpha, "
        "dropout, r, seed, target_modules",
    ]
    assert problems("tapo.policy", {"source": "tiny", "lora": {"alpha": 8}}, TextPolicy) == [
        "tapo.policy.lora.r: missing: set it in parameters"
    ]
    assert problems("tapo.policy", {"source": "tiny", "lora": {"r": 8}}, TextPolicy) == []
    assert problems("tapo.policy", {"source": "tiny", "lora": None}, TextPolicy) == []
    assert problems("tapo.policy", {"source": "tiny", "lora": LORA}, TextPolicy) == []
    # The experience model takes neither (it picks its own weights to train).
    (problem,) = problems("expmodel_sft.model", {"source": "tiny", "lora": LORA}, ExpmodelModel)
    assert problem.startswith("expmodel_sft.model: unknown key `lora`")


def test_only_the_rank_is_required_alpha_is_twice_it_and_every_linear_layer_gets_one():
    assert LoraSpec.from_params({"r": 8}) == LoraSpec(r=8, alpha=16.0, target_modules=ALL_LINEAR)
    assert LoraSpec.from_params({"r": 8, "alpha": None}).alpha == 16.0
    config = peft_config(LoraSpec.from_params({"r": 8}))
    assert (config.r, config.lora_alpha, config.target_modules) == (8, 16.0, "all-linear")


def _adapted(model) -> set[str]:
    """The module paths (``model.layers.0.self_attn.q_proj``) that carry an adapter."""
    return {name.split(".lora_A.")[0] for name in adapter_state_dict(model) if ".lora_A." in name}


def test_the_default_adapts_every_linear_layer_but_the_tied_output_head(tokenizer, caplog):
    plain, _ = load_policy(TINY_TEXT, processing_class=tokenizer)
    linear = {
        f"base_model.model.{name}"
        for name, module in plain.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    }
    with caplog.at_level(logging.INFO, logger="creditflow.models.lora"):
        model, _ = load_policy({**TINY_TEXT, "lora": {"r": 8}}, processing_class=tokenizer)
    # 1 layer: q, k, v, o, gate, up, down.
    assert _adapted(model) == linear and len(linear) == 7
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    (line,) = [r.getMessage() for r in caplog.records if "trainable parameters" in r.getMessage()]
    assert f"{trainable} trainable parameters of {total}" in line and "r=8, alpha=16" in line


def test_a_regular_expression_is_the_string_form_of_target_modules(tokenizer):
    # What --params can pass (it splits its argument at commas, so no list).
    model, _ = load_policy(
        {**TINY_TEXT, "lora": {"r": 4, "target_modules": r".*\.(q_proj|v_proj)"}},
        processing_class=tokenizer,
    )
    assert {name.rsplit(".", 1)[1] for name in _adapted(model)} == {"q_proj", "v_proj"}


def test_a_lora_text_policy_starts_as_its_base(tokenizer):
    plain, _ = load_policy(TINY_TEXT, processing_class=tokenizer)
    rng = torch.get_rng_state()
    model, _ = load_policy({**TINY_TEXT, "lora": LORA}, processing_class=tokenizer)
    assert torch.equal(torch.get_rng_state(), rng)  # the adapters draw from their own seed
    assert is_lora_model(model) and not model.training
    adapter = adapter_state_dict(model)
    assert adapter and all("lora_" in name for name in adapter)
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    ids = torch.tensor([tokenizer.encode("<translation>Wie viele Eier?</translation>")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)  # B = 0: adds nothing
    again, _ = load_policy({**TINY_TEXT, "lora": LORA}, processing_class=tokenizer)
    other, _ = load_policy({**TINY_TEXT, "lora": {**LORA, "seed": 1}}, processing_class=tokenizer)
    a = [n for n in adapter if "lora_A" in n][0]
    assert torch.equal(adapter_state_dict(again)[a], adapter[a])
    assert not torch.equal(adapter_state_dict(other)[a], adapter[a])


def test_a_lora_vl_policy_generates(processor):  # noqa: F811
    model, _ = load_policy({**TINY_VL, "lora": LORA}, processing_class=processor)
    assert is_lora_model(model)
    assert all(".language_model." in name for name in adapter_state_dict(model))
    ids = processor.tokenizer(["Add the two numbers"], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 1 and out.shape[1] > ids["input_ids"].shape[1]
