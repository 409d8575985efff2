"""``export_policy``: the weights and the tokenizer in one folder that plain ``transformers``
loads, a LoRA policy merged into its base (same outputs) or kept as adapters."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from creditflow.api import export_policy
from creditflow.models import load_policy, train_bpe_tokenizer
from creditflow.models.lora import adapter_state_dict, is_lora_model
from tests.models.conftest import TAPO_TOKENS
from tests.models.test_policy_spec import TINY_TEXT

PROMPT = "<translation>Wie viele Eier?</translation>"


def _logits(model, tokenizer) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokenizer.encode(PROMPT)])).logits


def test_a_policy_and_its_tokenizer_load_back_from_one_folder(tokenizer, tmp_path):
    model, _ = load_policy(TINY_TEXT, processing_class=tokenizer)
    folder = export_policy(model, tokenizer, tmp_path / "policy")
    again = AutoModelForCausalLM.from_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder).encode(PROMPT) == tokenizer.encode(PROMPT)
    torch.testing.assert_close(_logits(again, tokenizer), _logits(model, tokenizer))


def test_a_lora_policy_is_merged_by_default_and_left_as_it_was(tokenizer, tmp_path):
    pytest.importorskip("peft")
    model, _ = load_policy({**TINY_TEXT, "lora": {"r": 4}}, processing_class=tokenizer)
    with torch.no_grad():  # B = 0 at the start: give the adapters something to merge
        for name, tensor in model.named_parameters():
            if "lora_B" in name:
                tensor.normal_(0, 0.1)
    before = {k: v.clone() for k, v in adapter_state_dict(model).items()}
    merged = AutoModelForCausalLM.from_pretrained(export_policy(model, tokenizer, tmp_path / "m"))
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged, tokenizer), _logits(model, tokenizer))
    assert is_lora_model(model)  # the trained model itself is not merged
    assert all(torch.equal(before[k], v) for k, v in adapter_state_dict(model).items())
    adapters = export_policy(model, tokenizer, tmp_path / "a", merge_lora=False)
    assert (adapters / "adapter_config.json").is_file()


def test_another_runs_larger_tokenizer_is_refused_before_anything_is_written(
    corpus, tokenizer, tmp_path
):
    model, _ = load_policy(TINY_TEXT, processing_class=tokenizer)
    bigger = train_bpe_tokenizer(corpus, vocab_size=2048, special_tokens=TAPO_TOKENS)
    assert len(bigger) > model.get_input_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match="not the tokenizer this policy was trained with"):
        export_policy(model, bigger, tmp_path / "policy")
    assert not (tmp_path / "policy").exists()
