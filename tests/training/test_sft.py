"""SFT warm start: prompt tokens carry no loss, and a few steps lower the loss."""

import pytest
import torch

from creditflow.errors import ConfigError
from creditflow.training.sft import SFTConfig, run_sft, train_sft
from creditflow.training.teacher_forcing import (
    IGNORE_INDEX,
    build_sft_examples,
    collate_right_padded,
    completion_nll,
)


@pytest.mark.parametrize("use_chat_template", [True, False])
def test_examples_mask_the_prompt_and_keep_target_and_eos(tapo_tokenizer, use_chat_template):
    tok = tapo_tokenizer
    prompt, target = "Add 2 and 3.", "<translation>Add 2 and 3.</translation> \\boxed{5}"
    ((ids, labels),) = build_sft_examples(tok, [prompt], [target], 256, use_chat_template)
    text = prompt
    if use_chat_template:
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    target_ids = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ids == prompt_ids + target_ids
    assert labels == [IGNORE_INDEX] * len(prompt_ids) + target_ids
    assert labels[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")


def test_truncation_keeps_ids_and_labels_aligned(tapo_tokenizer):
    tok = tapo_tokenizer
    ((full_ids, full_labels),) = build_sft_examples(tok, ["Q"], ["a b c d e f"], 256)
    n_prompt = full_labels.count(IGNORE_INDEX)
    ((ids, labels),) = build_sft_examples(tok, ["Q"], ["a b c d e f"], n_prompt + 2)
    assert ids == full_ids[: n_prompt + 2]
    assert labels == full_labels[: n_prompt + 2]
    with pytest.raises(ValueError, match="max_length"):
        build_sft_examples(tok, ["Q"], ["a"], n_prompt)  # no target token would be left
    with pytest.raises(ValueError, match="2 prompts but 1 targets"):
        build_sft_examples(tok, ["Q", "R"], ["a"], 256)


def test_collate_pads_on_the_right():
    batch = collate_right_padded([([5, 6, 7], [-100, 6, 7]), ([8], [8])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]


def test_completion_nll_averages_over_labelled_tokens_only(make_model, tapo_tokenizer):
    """Against a loop: -log p(label_n | ids_<n) summed over labelled n, divided by their count."""
    model = make_model()
    examples = build_sft_examples(tapo_tokenizer, ["Add 2 and 3.", "Q"], ["5", "a b c"], 256)
    batch = collate_right_padded(examples, tapo_tokenizer.pad_token_id)
    total, count = 0.0, 0
    for ids, labels in examples:
        logits = model(input_ids=torch.tensor([ids])).logits[0]  # (N, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        for n in range(1, len(ids)):
            if labels[n] != IGNORE_INDEX:
                total -= logp[n - 1, labels[n]].item()
                count += 1
    assert completion_nll(model, batch).item() == pytest.approx(total / count, rel=1e-5)


def test_a_few_sft_steps_lower_the_loss_on_a_fixed_batch(make_model, tapo_tokenizer, tapo_texts):
    model = make_model()
    half = len(tapo_texts) // 2
    prompts, targets = tapo_texts[:4], tapo_texts[half : half + 4]
    examples = build_sft_examples(tapo_tokenizer, prompts, targets, 256)
    batch = collate_right_padded(examples, tapo_tokenizer.pad_token_id)
    with torch.no_grad():
        before = completion_nll(model, batch).item()
    # batch_size 4 over 4 examples: every step sees exactly this batch (in some order).
    config = SFTConfig(steps=8, batch_size=4, learning_rate=1e-2, warmup_steps=1)
    history = train_sft(model, tapo_tokenizer, prompts, targets, config, progress=False)
    with torch.no_grad():
        after = completion_nll(model, batch).item()
    assert after < before - 0.5
    assert history[0]["sft/loss"] == pytest.approx(before, rel=1e-4)
    assert [row["step"] for row in history] == [float(s) for s in range(1, 9)]
    assert history[-1]["lr"] == 0.0


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"steps": -1}, "steps"),
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"epochs": 2}, "epochs"),
    ],
)
def test_sft_config_errors_name_the_key(params, key):
    with pytest.raises(ConfigError, match=key):
        SFTConfig.from_params(params)


def test_zero_sft_steps_pass_the_initial_policy_through(make_model, tapo_tokenizer, tapo_texts):
    model = make_model()
    config = SFTConfig.from_params({"steps": 0, "learning_rate": -1.0})  # unused, unchecked
    assert config.skipped
    out, metrics = run_sft(model, tapo_tokenizer, tapo_texts[:2], tapo_texts[2:4], {"steps": 0})
    assert out is not model and metrics.empty and list(metrics.columns) == ["step"]
    after_sft = out.state_dict()
    for name, before in model.state_dict().items():
        after = after_sft[name]
        assert torch.equal(before, after), name
