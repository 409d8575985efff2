"""The policy spec's ``device`` and ``dtype`` for text and vision-language policies, tiny and
pretrained, and hub ids: a real Qwen2.5 / Qwen2.5-VL id loads from the local cache, and one
that is not cached fails naming the id and the cache."""

import importlib

import pandas as pd
import pytest
import torch
from huggingface_hub import constants as hf_constants

from creditflow.config.schema import problems
from creditflow.models import build_tiny_qwen2_5_vl, load_policy
from creditflow.models.builders import resolve_device, to_policy_device
from creditflow.pipelines.parameters import TextPolicy, VisionPolicy
from tests.models.test_policy_spec import TINY_TEXT, TINY_VL, processor  # noqa: F401 - fixture

TEXT_ID, VL_ID = "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct"
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def _devices(model) -> set[str]:
    return {str(p.device) for p in model.parameters()}


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_text_and_vl_policies_land_on_the_device(tokenizer, processor, device):  # noqa: F811
    expected = "cuda:0" if device == "auto" and torch.cuda.is_available() else "cpu"
    text, _ = load_policy({**TINY_TEXT, "device": device}, processing_class=tokenizer)
    vl, _ = load_policy({**TINY_VL, "device": device}, processing_class=processor)
    assert _devices(text) == _devices(vl) == {expected}


def test_a_tiny_policy_takes_the_dtype(tokenizer, processor):  # noqa: F811
    text, _ = load_policy({**TINY_TEXT, "dtype": "bfloat16"}, processing_class=tokenizer)
    vl, _ = load_policy({**TINY_VL, "dtype": "bfloat16"}, processing_class=processor)
    assert {p.dtype for p in text.parameters()} == {p.dtype for p in vl.parameters()}
    assert {p.dtype for p in text.parameters()} == {torch.bfloat16}
    as_built, _ = load_policy(
        TINY_TEXT, processing_class=tokenizer
    )  # "auto": as the builder makes it
    assert {p.dtype for p in as_built.parameters()} == {torch.float32}


@needs_no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_fails_before_anything_is_built(
    tokenizer,
    processor,  # noqa: F811
    device,
    monkeypatch,
):
    def no_build(*args, **kwargs):
        raise AssertionError("built a model for an invalid spec")

    monkeypatch.setattr("creditflow.models.builders.build_tiny_qwen2", no_build)
    monkeypatch.setattr("creditflow.models.vision.build_tiny_qwen2_5_vl", no_build)
    fix = "set the policy's device to 'cpu', or to 'auto'"
    with pytest.raises(ValueError, match=f"device '{device}' is not available.*no CUDA device"):
        load_policy({**TINY_TEXT, "device": device}, processing_class=tokenizer)
    with pytest.raises(ValueError, match=fix):
        load_policy({**TINY_VL, "device": device}, processing_class=processor)
    # The check a run makes before its first node (ParameterCheckHook) says the same; the
    # one on --params overrides, before torch loads, checks the name's form only.
    spec = {"source": "tiny", "device": device}
    for block in (TextPolicy, VisionPolicy):
        before_first_node = {"check_device": resolve_device}
        (problem,) = problems("tapo.policy", spec, block, context=before_first_node)
        assert problem.startswith("tapo.policy: device") and fix in problem
        assert problems("tapo.policy", spec, block) == []


def test_an_unknown_device_name_lists_the_valid_ones(tokenizer):
    with pytest.raises(ValueError, match=r"unknown device 'gpu'; valid: 'auto', 'cpu', 'cuda'"):
        load_policy({**TINY_TEXT, "device": "gpu"}, processing_class=tokenizer)
    with pytest.raises(ValueError, match="unknown device 'cuda:x'"):
        resolve_device("cuda:x")


def test_to_policy_device_moves_a_loaded_policy(tiny_model):
    assert to_policy_device(tiny_model, {"source": "tiny"}) is tiny_model
    assert _devices(to_policy_device(tiny_model, {"device": "cpu"})) == {"cpu"}


@pytest.mark.parametrize(
    ("module", "node"),
    [("tapo", "warm_start_tapo_policy"), ("tor", "warm_start_tor_policy")],
)
def test_a_node_puts_the_policy_it_reads_on_the_spec_device(monkeypatch, module, node):
    """The catalog loads saved policies on the CPU; the warm start (sft.steps 0 here) moves
    its input to ``policy.device`` before training, as the GRPO and evaluation nodes do."""
    nodes = importlib.import_module(f"creditflow.pipelines.{module}.nodes")
    moved = []
    monkeypatch.setattr(nodes, "to_policy_device", lambda m, spec: moved.append(spec) or m)
    spec = {"source": "tiny", "device": "cpu"}
    # train_vision_encoder (tor): the stand-in Linear has no vision encoder to freeze.
    params = {
        "policy": spec,
        "sft": {"steps": 0},
        "torch_threads": None,
        "train_vision_encoder": True,
    }
    tasks = pd.DataFrame(columns=["question", "question_en", "answer", "reasoning_en"])
    tasks["reasoning"], tasks["image_png"] = [], []
    model, _ = getattr(nodes, node)(torch.nn.Linear(1, 1), None, tasks, None, params)
    assert moved == [spec] and isinstance(model, torch.nn.Linear)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache in ``tmp_path`` (transformers reads the location per call)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    return tmp_path


def _cache(hub_cache, repo_id: str, *artifacts) -> None:
    """Lay ``artifacts`` (save_pretrained objects) out as the cache holds a downloaded repo."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    for artifact in artifacts:
        artifact.save_pretrained(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_real_qwen_ids_load_from_the_local_cache_text_and_vl_alike(
    hub_cache,
    tokenizer,
    tiny_model,
    processor,  # noqa: F811
):
    vl_model = build_tiny_qwen2_5_vl(processor, hidden_size=32, vision_depth=1)
    _cache(hub_cache, TEXT_ID, tiny_model, tokenizer)
    _cache(hub_cache, VL_ID, vl_model, processor)
    text, text_tokenizer = load_policy({"source": "pretrained", "name_or_path": TEXT_ID})
    vl, vl_processor = load_policy({"source": "pretrained", "name_or_path": VL_ID})
    assert text.name_or_path == TEXT_ID and vl.name_or_path == VL_ID
    assert text_tokenizer.padding_side == vl_processor.tokenizer.padding_side == "left"
    assert type(vl).__name__ == "Qwen2_5_VLForConditionalGeneration"


@pytest.mark.parametrize(("load", "name"), [(load_policy, TEXT_ID), (load_policy, VL_ID)])
def test_an_uncached_real_id_names_the_id_and_the_cache(hub_cache, load, name):
    with pytest.raises(OSError, match="could not load the policy checkpoint") as info:
        load({"source": "pretrained", "name_or_path": name})
    message = str(info.value)
    assert f"{name!r}" in message and f"hf download {name}" in message
    assert f"local Hugging Face cache ({hub_cache}" in message and "HF_HUB_OFFLINE=1" in message
    assert isinstance(info.value.__cause__, OSError)


@pytest.mark.parametrize(
    ("module", "node", "name"),
    [("tapo", "train_tapo_tokenizer", TEXT_ID), ("tor", "train_tor_processor", VL_ID)],
)
def test_the_first_node_to_read_an_uncached_id_names_it(hub_cache, module, node, name):
    """The tokenizer / processor node runs before the policy is loaded."""
    nodes = importlib.import_module(f"creditflow.pipelines.{module}.nodes")
    params = {"policy": {"source": "pretrained", "name_or_path": name}}
    with pytest.raises(OSError, match=f"could not load the policy checkpoint '{name}'"):
        getattr(nodes, node)(pd.DataFrame(), params)


@pytest.mark.gpu
def test_text_and_vl_policies_on_cuda(tokenizer, processor, tmp_path):  # noqa: F811
    text, _ = load_policy({**TINY_TEXT, "device": "cuda"}, processing_class=tokenizer)
    vl, _ = load_policy(
        {**TINY_VL, "device": "cuda:0", "dtype": "bfloat16"}, processing_class=processor
    )
    assert _devices(text) == _devices(vl) == {"cuda:0"}
    text.cpu().save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_policy(
        {"source": "pretrained", "name_or_path": str(tmp_path), "device": "cuda"}
    )
    assert _devices(loaded) == {"cuda:0"}
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"has {count} CUDA device"):
        resolve_device(f"cuda:{count}")
