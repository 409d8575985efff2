import pytest
import torch

from creditflow.models import build_tiny_qwen2, load_policy, train_bpe_tokenizer


@pytest.fixture
def checkpoint_dir(tmp_path, tokenizer, tiny_model):
    """A local checkpoint laid out like a hub snapshot: model and tokenizer side by side."""
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"source": "hub"}, r"unknown policy source 'hub'; valid: \['pretrained', 'tiny'\]"),
        ({}, "unknown policy source None"),
        ({"source": "pretrained"}, "needs 'name_or_path': set it in parameters"),
        ({"source": "pretrained", "name_or_path": ""}, "needs 'name_or_path'"),
        ({"source": "pretrained", "name_or_path": "x", "dtype": "fp8"}, "unknown dtype 'fp8'"),
        (
            {"source": "pretrained", "name_or_path": "x", "attn_implementation": "flash"},
            "unknown attn_implementation",
        ),
        (
            {"source": "pretrained", "name_or_path": "x", "revison": "main"},
            r"unknown keys \['revison'\]",
        ),
        (
            {"source": "pretrained", "name_or_path": "x", "trust_remote_code": "false"},
            "must be true or false",
        ),
        ({"source": "tiny", "tiny": {"width": 8}}, r"unknown keys \['width'\] under 'tiny'"),
    ],
)
def test_invalid_specs_fail_before_loading(tokenizer, spec, match):
    with pytest.raises(ValueError, match=match):
        load_policy(spec, processing_class=tokenizer)


def test_tiny_needs_a_tokenizer():
    with pytest.raises(ValueError, match="pass load_policy\\(spec, processing_class=...\\)"):
        load_policy({"source": "tiny"})


def test_tiny_builds_what_build_tiny_qwen2_builds(tokenizer):
    spec = {"source": "tiny", "tiny": {"hidden_size": 32, "num_hidden_layers": 1, "seed": 3}}
    model, tok = load_policy(spec, processing_class=tokenizer)
    direct = build_tiny_qwen2(tokenizer, hidden_size=32, num_hidden_layers=1, seed=3)
    assert tok is tokenizer
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    for name, weight in direct.state_dict().items():
        assert torch.equal(model.state_dict()[name], weight), name


def test_pretrained_from_a_local_directory(checkpoint_dir, tokenizer, tiny_model):
    spec = {
        "source": "pretrained",
        "name_or_path": str(checkpoint_dir),
        "dtype": "float32",
        "trust_remote_code": False,
        "attn_implementation": "eager",
    }
    model, tok = load_policy(spec)
    text = "<translation>Сколько яиц?</translation> \\boxed{13}"
    assert tok.encode(text) == tokenizer.encode(text)
    assert tok.padding_side == "left"
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 2)
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, tiny_model(ids).logits)
    assert model.generation_config.pad_token_id == 0
    assert not model.training


def test_pretrained_dtype_is_applied(checkpoint_dir):
    model, _ = load_policy(
        {"source": "pretrained", "name_or_path": checkpoint_dir, "dtype": "bfloat16"}
    )
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_pretrained_right_padding_tokenizer_is_switched_to_left(checkpoint_dir, tokenizer):
    tokenizer_copy = train_bpe_tokenizer(["abc abc"], vocab_size=300)
    tokenizer_copy.padding_side = "right"
    _, tok = load_policy(
        {"source": "pretrained", "name_or_path": str(checkpoint_dir)},
        processing_class=tokenizer_copy,
    )
    assert tok is tokenizer_copy and tok.padding_side == "left"


def test_pretrained_rejects_a_tokenizer_larger_than_the_embedding(checkpoint_dir, corpus):
    bigger = train_bpe_tokenizer(corpus, vocab_size=600)
    with pytest.raises(ValueError, match="pass the checkpoint's own tokenizer"):
        load_policy(
            {"source": "pretrained", "name_or_path": str(checkpoint_dir)}, processing_class=bigger
        )


def test_uncached_hub_id_offline_says_how_to_fix_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = "creditflow-tests/no-such-model-0.5B"
    with pytest.raises(OSError, match="Download it first") as info:
        load_policy({"source": "pretrained", "name_or_path": name})
    message = str(info.value)
    assert f"hf download {name}" in message
    assert "local checkpoint directory" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert isinstance(info.value.__cause__, OSError)
