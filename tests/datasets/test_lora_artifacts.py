"""LoRA policies through the catalog's model datasets: the adapter in safetensors, the base
beside it only when it cannot be loaded by name, trainable adapters after loading."""

import json

import pytest
import torch
from kedro.io import Version

from creditflow.datasets import HFModelDataset, HFModelsBySeedDataset
from creditflow.models import load_policy
from creditflow.models.lora import is_lora_model
from tests.models.test_policy_spec import TINY_VL, processor  # noqa: F401 - fixture

pytest.importorskip("peft")

V1 = "2026-01-01T00.00.00.000Z"
EAGER = {"attn_implementation": "eager"}  # the tiny models are eager; same kernel -> same bits
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _trained_lora(spec, tokenizer):
    """A LoRA policy whose adapters moved off their zero start (B = 0 would hide a lost one)."""
    model, _ = load_policy(spec, processing_class=tokenizer)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(generator=torch.Generator().manual_seed(0))
    return model


def _logits(model, input_ids):
    with torch.no_grad():
        return model(input_ids).logits  # (B, T, V)


def _adapter(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_a_tiny_lora_policy_carries_its_base_and_loads_back_trainable(
    tmp_path, tokenizer, input_ids
):
    model = _trained_lora({"source": "tiny", "tiny": {"seed": 0}, "lora": LORA}, tokenizer)
    path = str(tmp_path / "policy")
    HFModelDataset(path, version=Version(None, V1)).save(model)
    saved = tmp_path / "policy" / V1 / "policy"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in saved.iterdir()}
    assert not (saved / "model.safetensors").exists()
    assert (saved / "base" / "model.safetensors").is_file()  # built in memory: no name to load

    loaded = HFModelDataset(path, version=Version(V1, None), load_args=EAGER).load()
    assert is_lora_model(loaded) and not loaded.training
    assert torch.equal(_logits(loaded, input_ids), _logits(model, input_ids))
    trainable = _adapter(loaded)
    assert trainable.keys() == _adapter(model).keys() and all("lora_" in n for n in trainable)
    for name, tensor in _adapter(model).items():
        assert torch.equal(trainable[name], tensor), name

    # Saved again (a downstream node's output), it carries the base once more instead of
    # pointing into the first artifact's folder.
    again = tmp_path / "again"
    HFModelDataset(str(again)).save(loaded)
    assert (again / "base" / "model.safetensors").is_file()
    config = json.loads((again / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] is None
    reloaded = HFModelDataset(str(again), load_args=EAGER).load()
    assert torch.equal(_logits(reloaded, input_ids), _logits(model, input_ids))


def test_a_pretrained_lora_policy_saves_only_its_adapter(tmp_path, tokenizer, model_a, input_ids):
    checkpoint = tmp_path / "checkpoint"
    model_a.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    spec = {"source": "pretrained", "name_or_path": str(checkpoint), "lora": LORA, **EAGER}
    model = _trained_lora(spec, tokenizer)
    path = tmp_path / "policy"
    HFModelDataset(str(path)).save(model)
    assert not (path / "base").exists()
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(checkpoint)
    adapter_bytes = (path / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < (checkpoint / "model.safetensors").stat().st_size / 10

    loaded = HFModelDataset(str(path), load_args=EAGER).load()
    assert is_lora_model(loaded)
    assert torch.equal(_logits(loaded, input_ids), _logits(model, input_ids))
    # The base is the checkpoint's, frozen; the adapter trains.
    base = loaded.get_base_model().state_dict()
    for name, tensor in model_a.state_dict().items():
        key = name.replace("q_proj.", "q_proj.base_layer.").replace("v_proj.", "v_proj.base_layer.")
        assert torch.equal(base[key], tensor), name
    assert all(not p.requires_grad for n, p in loaded.named_parameters() if "lora_" not in n)


def test_models_by_seed_round_trip_lora_policies(tmp_path, tokenizer, input_ids):
    models = {
        seed: _trained_lora(
            {"source": "tiny", "tiny": {"seed": 0}, "lora": {**LORA, "seed": seed}}, tokenizer
        )
        for seed in (0, 1)
    }
    dataset = HFModelsBySeedDataset(str(tmp_path / "policies"), load_args=EAGER)
    dataset.save(models)
    loaded = dataset.load()
    assert list(loaded) == [0, 1]
    for seed, model in models.items():
        assert (tmp_path / "policies" / f"seed_{seed}" / "adapter_model.safetensors").is_file()
        assert torch.equal(_logits(loaded[seed], input_ids), _logits(model, input_ids))


def test_a_vl_lora_policy_round_trips_as_the_tor_entries_load_it(tmp_path, processor):  # noqa: F811
    model, _ = load_policy({**TINY_VL, "lora": LORA}, processing_class=processor)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(generator=torch.Generator().manual_seed(0))
    options = {"model_class": "AutoModelForImageTextToText", "load_args": EAGER}
    HFModelDataset(str(tmp_path / "tor_sft_policy"), **options).save(model)
    loaded = HFModelDataset(str(tmp_path / "tor_sft_policy"), **options).load()
    assert is_lora_model(loaded)
    assert type(loaded.get_base_model()).__name__ == "Qwen2_5_VLForConditionalGeneration"
    ids = processor.tokenizer(["Add the two numbers"], return_tensors="pt")["input_ids"]
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))
