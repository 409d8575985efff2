"""The token-level credit inspector (creditflow.training.credit)."""

import pandas as pd
import pytest
import torch

from creditflow.algorithms import group_zscore
from creditflow.config.grpo import CreditInspection
from creditflow.errors import ConfigError
from creditflow.training import GRPOConfig
from creditflow.training.credit import CREDIT_COLUMNS, segment_labels, token_texts
from tests.training.helpers import make_trainer


def test_recorded_steps_default_to_first_middle_last():
    assert CreditInspection().recorded_steps(3) == {1, 2, 3}
    assert CreditInspection().recorded_steps(1) == {1}
    assert CreditInspection(steps=[4]).recorded_steps(10) == {4}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"rollouts": 0}, "rollouts must be >= 1"),
        ({"steps": [0]}, r"steps must list steps in \[1, steps = 5\]"),
        ({"steps": [6]}, "1-based"),
        ({"every": 2}, "unknown credit_inspector option"),
    ],
)
def test_a_bad_inspector_spec_fails_naming_the_key(spec, match):
    with pytest.raises(ConfigError, match=match):
        GRPOConfig(steps=5, credit_inspector=spec).validate()


def test_the_inspector_is_not_part_of_the_checkpoint_key():
    on = GRPOConfig(credit_inspector={"rollouts": 2})
    assert on.run_key() == GRPOConfig().run_key()
    assert "credit_inspector" in on.to_dict()


def test_token_texts_concatenate_to_the_decoding(tapo_tokenizer):
    text = "<translation>Anna hat 5 Äpfel.</translation> 5 + 3 = 8 \\boxed{8}"
    ids = tapo_tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = token_texts(ids, tapo_tokenizer)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tapo_tokenizer.decode(ids, skip_special_tokens=False)


def test_segments_split_at_the_closing_tag_and_other_without_it(tapo_tokenizer):
    tok = tapo_tokenizer
    closed = tok("<translation>Q</translation> 5 + 3", add_special_tokens=False)["input_ids"]
    open_ = tok("<translation>Anna has", add_special_tokens=False)["input_ids"]
    width = max(len(closed), len(open_))
    ids = torch.full((2, width), tok.pad_token_id)
    mask = torch.zeros(2, width)
    for row, tokens in enumerate([closed, open_]):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1.0
    texts = tok.batch_decode(ids, skip_special_tokens=True)
    labels = segment_labels(ids, mask, texts, tok)
    close_at = closed.index(tok.convert_tokens_to_ids("</translation>"))
    assert labels[0] == ["translation"] * (close_at + 1) + ["reasoning"] * (
        len(closed) - close_at - 1
    )
    assert labels[1] == ["other"] * len(open_)


def _credit_run(make_model, tapo_tokenizer, tapo_prompts, **overrides) -> pd.DataFrame:
    trainer = make_trainer(
        make_model(),
        tapo_tokenizer,
        tapo_prompts,
        steps=3,
        credit_inspector={"steps": None, "rollouts": 4},
        **overrides,
    )
    return pd.DataFrame(trainer.train().credit)


def test_the_inspector_records_the_credit_the_update_received(
    make_model, tapo_tokenizer, tapo_prompts
):
    """3 steps -> steps 1, 2 and 3 recorded; the 4 recorded completions are the first group
    (G = 4), so their GRPO advantage is the group z-score of their own length reward, on every
    token, and uniform weights make credit = advantage."""
    table = _credit_run(make_model, tapo_tokenizer, tapo_prompts)
    assert list(table.columns[: len(CREDIT_COLUMNS)]) == list(CREDIT_COLUMNS)
    assert sorted(table["step"].unique()) == [1, 2, 3]
    for _, step in table.groupby("step"):
        per_row = step.groupby("row").agg(
            adv_min=("advantage", "min"),
            adv_max=("advantage", "max"),
            reward=("reward/length", "first"),
            n=("position", "size"),
        )
        assert list(per_row.index) == [0, 1, 2, 3]
        assert per_row["adv_min"].tolist() == per_row["adv_max"].tolist()
        expected = group_zscore(torch.tensor(per_row["reward"].tolist()), 4)
        torch.testing.assert_close(
            torch.tensor(per_row["adv_min"].tolist()), expected, atol=1e-5, rtol=0
        )
        assert (step.groupby("row")["position"].max() + 1).tolist() == per_row["n"].tolist()
    assert (table["weight"] == 1.0).all() and table["selected"].all()
    assert (table["credit"] == table["advantage"]).all()
    # One optimizer step per rollout batch: the loss's ratio is exactly 1, nothing clipped.
    assert (table["ratio"] == 1.0).all() and not table["clipped"].any()
    assert table["entropy"].isna().all() and table["image_logp_diff"].isna().all()


def test_ratios_come_from_the_last_update_pass(make_model, tapo_tokenizer, tapo_prompts):
    """Two passes over each rollout batch: the second pass's ratios differ from 1, and a token
    is marked clipped exactly where its ratio left the clip range in its advantage's
    direction (clip 0.2 both ways); the entropy-reading strategy's entropies are recorded."""
    table = _credit_run(
        make_model,
        tapo_tokenizer,
        tapo_prompts,
        num_iterations=2,
        learning_rate=5e-2,
        token_weights={"name": "high_entropy_20"},
    )
    assert (table["ratio"] != 1.0).any()
    outside = ((table["ratio"] > 1.2) & (table["advantage"] > 0)) | (
        (table["ratio"] < 0.8) & (table["advantage"] < 0)
    )
    assert (table["clipped"] == outside).all()
    assert table["entropy"].notna().all()
    assert set(table["weight"].unique()) <= {0.0, 1.0}


def test_the_inspector_off_records_nothing(make_model, tapo_tokenizer, tapo_prompts):
    trainer = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, steps=1)
    assert trainer.credit is None and trainer.train().credit == []
