import shutil

import numpy as np
import pytest
import torch
import transformers
from kedro.io import DataCatalog, Version
from kedro.io.core import DatasetError

from creditflow.datasets import (
    HFModelDataset,
    HFModelsByNameDataset,
    HFModelsBySeedDataset,
    HFTokenizerDataset,
    resolve_pretrained_class,
)
from creditflow.models import train_bpe_tokenizer

V1, V2 = "2026-01-01T00.00.00.000Z", "2026-01-02T00.00.00.000Z"
EAGER = {"attn_implementation": "eager"}  # the saved models are eager; same kernel -> same bits


def _logits(model, input_ids):
    with torch.no_grad():
        return model(input_ids).logits  # (B, T, V)


def test_versions_coexist_and_load_picks_the_latest(tmp_path, model_a, model_b, input_ids):
    path = str(tmp_path / "policy")
    HFModelDataset(path, version=Version(None, V1)).save(model_a)
    HFModelDataset(path, version=Version(None, V2)).save(model_b)

    for version in (V1, V2):
        saved = tmp_path / "policy" / version / "policy"
        files = {p.name for p in saved.iterdir()}
        assert "model.safetensors" in files and "config.json" in files
        assert not [f for f in files if f.endswith((".bin", ".pkl", ".pt", ".pth"))]

    latest = HFModelDataset(path, version=Version(None, None), load_args=EAGER)
    assert latest.exists()
    assert latest.list_versions(full_path=False) == [V2, V1]
    assert torch.equal(_logits(latest.load(), input_ids), _logits(model_b, input_ids))
    pinned = HFModelDataset(path, version=Version(V1, None), load_args=EAGER)
    assert torch.equal(_logits(pinned.load(), input_ids), _logits(model_a, input_ids))
    assert not torch.equal(_logits(model_a, input_ids), _logits(model_b, input_ids))


def test_a_missing_pinned_version_fails_naming_the_path(tmp_path, model_a):
    path = str(tmp_path / "policy")
    HFModelDataset(path, version=Version(None, V1)).save(model_a)
    missing = HFModelDataset(path, version=Version("2000-01-01T00.00.00.000Z", None))
    with pytest.raises(DatasetError, match="2000-01-01T00.00.00.000Z.*--load-versions"):
        missing.load()


def test_saving_the_same_version_twice_is_refused(tmp_path, model_a):
    dataset = HFModelDataset(str(tmp_path / "policy"), version=Version(None, V1))
    dataset.save(model_a)
    with pytest.raises(DatasetError, match="must not exist"):
        HFModelDataset(str(tmp_path / "policy"), version=Version(None, V1)).save(model_a)


def test_unversioned_round_trip_and_exists(tmp_path, model_a, input_ids):
    dataset = HFModelDataset(str(tmp_path / "policy"), load_args=EAGER)
    assert not dataset.exists()
    dataset.save(model_a)
    assert dataset.exists() and (tmp_path / "policy" / "model.safetensors").is_file()
    assert torch.equal(_logits(dataset.load(), input_ids), _logits(model_a, input_ids))


def test_load_args_reach_from_pretrained(tmp_path, model_a):
    HFModelDataset(str(tmp_path / "policy")).save(model_a)
    loaded = HFModelDataset(str(tmp_path / "policy"), load_args={"dtype": "bfloat16"}).load()
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_model_class_may_be_a_dotted_path(tmp_path, model_a, input_ids):
    HFModelDataset(str(tmp_path / "policy")).save(model_a)
    dataset = HFModelDataset(
        str(tmp_path / "policy"),
        load_args=EAGER,
        model_class="transformers.models.qwen2.modeling_qwen2.Qwen2ForCausalLM",
    )
    loaded = dataset.load()
    assert type(loaded) is transformers.Qwen2ForCausalLM
    assert torch.equal(_logits(loaded, input_ids), _logits(model_a, input_ids))


def test_class_names_resolve_or_fail_listing_the_valid_forms():
    assert resolve_pretrained_class("AutoModelForImageTextToText") is (
        transformers.AutoModelForImageTextToText
    )
    assert resolve_pretrained_class("transformers.AutoProcessor") is transformers.AutoProcessor
    for bad in ("AutoModelForEverything", "transformers.nope.Model", "math.sqrt"):
        with pytest.raises(ValueError, match="AutoModelForCausalLM"):
            resolve_pretrained_class(bad)
    with pytest.raises(ValueError, match="not a class with from_pretrained"):
        HFModelDataset("data/06_models/x", model_class="AutoModelForEverything")


def test_remote_filepaths_are_refused():
    with pytest.raises(DatasetError, match="needs a local filepath"):
        HFModelDataset("s3://bucket/policy")


def test_a_save_without_safetensors_is_refused(tmp_path):
    class PickleOnlyModel:
        def save_pretrained(self, directory):
            (tmp_path / "policy").mkdir()
            (tmp_path / "policy" / "pytorch_model.bin").write_bytes(b"pickle")

    with pytest.raises(DatasetError, match="no \\*.safetensors"):
        HFModelDataset(str(tmp_path / "policy")).save(PickleOnlyModel())


def test_tokenizer_versioned_round_trip(tmp_path, tokenizer):
    path = str(tmp_path / "tokenizer")
    HFTokenizerDataset(path, version=Version(None, V1)).save(tokenizer)
    loaded = HFTokenizerDataset(path, version=Version(None, None)).load()
    text = "<translation>Wie viele Eier?</translation> 珍妮特 \\boxed{2,125} e\u0301"
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.decode(loaded.encode(text), skip_special_tokens=True) == text
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.bos_token) == (0, 2, None)
    assert loaded.padding_side == "left"
    assert loaded.chat_template == tokenizer.chat_template
    assert loaded.get_vocab() == tokenizer.get_vocab()


def test_tokenizer_load_args_reach_from_pretrained(tmp_path, tokenizer):
    HFTokenizerDataset(str(tmp_path / "tok")).save(tokenizer)
    loaded = HFTokenizerDataset(str(tmp_path / "tok"), load_args={"padding_side": "right"}).load()
    assert loaded.padding_side == "right"


def test_processor_round_trip_through_auto_processor(tmp_path):
    tokenizer = train_bpe_tokenizer(
        ["a cover image of a cat"] * 5, vocab_size=300, special_tokens=["<image>"]
    )
    image_processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}
    )
    processor = transformers.LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=14, image_token="<image>"
    )
    dataset = HFTokenizerDataset(str(tmp_path / "processor"), processor_class="AutoProcessor")
    dataset.save(processor)
    loaded = dataset.load()
    assert type(loaded) is transformers.LlavaProcessor
    image = np.arange(40 * 40 * 3, dtype=np.uint8).reshape(40, 40, 3)
    inputs = {"text": ["<image> a cat"], "images": [image], "return_tensors": "pt"}
    expected, actual = processor(**inputs), loaded(**inputs)
    # A 28x28 crop with 14x14 patches -> 4 image tokens in place of "<image>".
    assert actual["input_ids"][0].tolist().count(tokenizer.convert_tokens_to_ids("<image>")) == 4
    assert torch.equal(actual["input_ids"], expected["input_ids"])
    assert torch.equal(actual["pixel_values"], expected["pixel_values"])


def test_catalog_yaml_config_saves_and_loads_versioned_artifacts(
    tmp_path, tokenizer, model_a, input_ids
):
    config = {
        "policy_checkpoint": {
            "type": "creditflow.datasets.HFModelDataset",
            "filepath": str(tmp_path / "06_models" / "policy"),
            "versioned": True,
            "load_args": EAGER,
        },
        "policy_tokenizer": {
            "type": "creditflow.datasets.HFTokenizerDataset",
            "filepath": str(tmp_path / "06_models" / "tokenizer"),
            "versioned": True,
        },
    }
    catalog = DataCatalog.from_config(config, save_version=V1)
    assert not catalog.exists("policy_checkpoint")
    catalog.save("policy_checkpoint", model_a)
    catalog.save("policy_tokenizer", tokenizer)
    assert (tmp_path / "06_models" / "policy" / V1 / "policy" / "model.safetensors").is_file()

    fresh = DataCatalog.from_config(config)  # a later run: load the latest version
    model, tok = fresh.load("policy_checkpoint"), fresh.load("policy_tokenizer")
    assert torch.equal(_logits(model, input_ids), _logits(model_a, input_ids))
    assert tok.encode("\\boxed{13}") == tokenizer.encode("\\boxed{13}")


def test_models_by_seed_round_trip_in_seed_order(tmp_path, model_a, model_b, input_ids):
    """A comparison strategy's GRPO policies, one per seed."""
    dataset = HFModelsBySeedDataset(str(tmp_path / "policies"), load_args=EAGER)
    dataset.save({0: model_a, 10: model_b, 2: model_a})
    assert sorted(p.name for p in (tmp_path / "policies").iterdir()) == [
        "seed_0",
        "seed_10",
        "seed_2",
    ]
    loaded = dataset.load()
    assert list(loaded) == [0, 2, 10]
    assert torch.equal(_logits(loaded[10], input_ids), _logits(model_b, input_ids))
    assert torch.equal(_logits(loaded[2], input_ids), _logits(model_a, input_ids))
    with pytest.raises(DatasetError, match=r"seed \(int\): model"):
        dataset.save({"seed_0": model_a})


def test_models_by_name_round_trip_and_an_empty_mapping(tmp_path, model_a, model_b, input_ids):
    """Page GRPO's R_old variants, one per name; none configured saves an empty folder."""
    dataset = HFModelsByNameDataset(str(tmp_path / "variants"), load_args=EAGER)
    dataset.save({"oracle": model_b, "features_only": model_a})
    loaded = dataset.load()
    assert list(loaded) == ["features_only", "oracle"]
    assert torch.equal(_logits(loaded["oracle"], input_ids), _logits(model_b, input_ids))
    with pytest.raises(DatasetError, match="letters, digits"):
        dataset.save({"../escape": model_a})
    empty = HFModelsByNameDataset(str(tmp_path / "none"))
    empty.save({})
    assert empty.load() == {}


def test_a_save_killed_midway_never_becomes_the_newest_version(
    tmp_path, monkeypatch, model_a, model_b, input_ids
):
    # Before: the half-written V2 was the newest version, and loading "the stored warm start"
    # failed with "no file named model.safetensors".
    path = tmp_path / "policy"
    HFModelDataset(str(path), version=Version(None, V1)).save(model_a)
    killed_here = tmp_path / "killed" / "policy"
    real_save = type(model_b).save_pretrained

    def save_then_die(model, directory, **kwargs):
        model.config.save_pretrained(directory)  # config.json written, the weights not yet
        # What a kill at this instant leaves on the disk: this copy (no cleanup ever runs).
        shutil.copytree(path, killed_here, symlinks=True)
        raise KeyboardInterrupt  # the run dies here

    monkeypatch.setattr(type(model_b), "save_pretrained", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        HFModelDataset(str(path), version=Version(None, V2)).save(model_b)
    monkeypatch.setattr(type(model_b), "save_pretrained", real_save)

    half_written = [p for p in (killed_here / V2).iterdir()]
    assert [p.name.startswith(".policy.partial-") for p in half_written] == [True]
    assert (half_written[0] / "config.json").is_file()
    for root in (killed_here, path):  # as a kill left it; as the interrupted save left it
        latest = HFModelDataset(str(root), version=Version(None, None), load_args=EAGER)
        assert latest.list_versions(full_path=False) == [V1]
        assert torch.equal(_logits(latest.load(), input_ids), _logits(model_a, input_ids))
    assert not any((path / V2).iterdir())  # the interrupted save removed its hidden folder
    # The next save of the killed run's version, and its load, work as ever.
    HFModelDataset(str(killed_here), version=Version(None, V2)).save(model_b)
    latest = HFModelDataset(str(killed_here), version=Version(None, None), load_args=EAGER)
    assert latest.list_versions(full_path=False) == [V2, V1]
    assert torch.equal(_logits(latest.load(), input_ids), _logits(model_b, input_ids))


def test_an_unversioned_save_replaces_the_previous_one_whole(tmp_path, model_a, input_ids):
    dataset = HFModelDataset(str(tmp_path / "policy"), load_args=EAGER)
    dataset.save(model_a)
    (tmp_path / "policy" / "stale.txt").write_text("from an older save")
    dataset.save(model_a)
    assert not (tmp_path / "policy" / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]  # no hidden folder left
    assert torch.equal(_logits(dataset.load(), input_ids), _logits(model_a, input_ids))


def test_models_by_seed_and_tokenizers_are_saved_whole_or_not_at_all(
    tmp_path, monkeypatch, model_a, tokenizer
):
    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    by_seed = HFModelsBySeedDataset(str(tmp_path / "policies"), version=Version(None, V1))
    calls = []
    real_save = type(model_a).save_pretrained

    def second_seed_fails(model, directory, **kwargs):
        calls.append(directory)
        if len(calls) == 2:
            fail()
        real_save(model, directory, **kwargs)

    monkeypatch.setattr(type(model_a), "save_pretrained", second_seed_fails)
    with pytest.raises(DatasetError, match="No space left"):
        by_seed.save({0: model_a, 1: model_a})
    assert not HFModelsBySeedDataset(
        str(tmp_path / "policies"), version=Version(None, None)
    ).exists()
    assert not any((tmp_path / "policies" / V1).iterdir())
    monkeypatch.setattr(type(tokenizer), "save_pretrained", fail)
    with pytest.raises(DatasetError, match="No space left"):
        HFTokenizerDataset(str(tmp_path / "tok"), version=Version(None, V1)).save(tokenizer)
    assert not HFTokenizerDataset(str(tmp_path / "tok"), version=Version(None, None)).exists()
    assert not any((tmp_path / "tok" / V1).iterdir())
