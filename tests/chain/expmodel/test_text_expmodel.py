"""The text-only ExpModel (chain.expmodel.text): prompt encoding, catalogue pairs, the scale
match, a tiny SFT + PFT run, and the paired s_exp effect table."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from creditflow.chain.ab_test.reporting import paired_gains_by_band, teacher_agreement
from creditflow.chain.expmodel import data as expmodel_data
from creditflow.chain.expmodel import pft as expmodel_pft
from creditflow.chain.expmodel import text as text_expmodel
from creditflow.chain.expmodel.scorer import ExpScorer
from creditflow.models import build_tiny_qwen2, train_bpe_tokenizer
from creditflow.training.sft import run_sft
from creditflow.training.supervised import SupervisedConfig

TEXTS = pd.DataFrame(
    {
        "item_id": [1, 2, 3, 4, 5, 6],
        "title": ["Heat (1995)", "Up (2009)", "Cars (2006)", "Alien (1979)", "Big (1988)", "X"],
        "year": [1995, 2009, 2006, 1979, 1988, None],
        "genres": [["Crime"], ["Animation"], ["Animation"], ["Horror"], ["Comedy"], []],
        "tags": [["tense"], ["sad", "funny"], [], ["scary"], [], []],
    }
)
ANNOTATIONS = pd.DataFrame(
    {
        "item_id": [1, 2, 3, 4, 5],
        "status": ["ok"] * 5,
        "overall": [4.2, 4.0, 3.1, 3.9, 2.5],
        "analysis": ["Great.", "Moving.", "Fine.", "Scary.", "Weak."],
    }
)


@pytest.fixture(scope="module")
def tokenizer():
    prompts = list(text_expmodel.text_expmodel_prompts(TEXTS).values())
    targets = [text_expmodel.text_expmodel_target(r) for r in ANNOTATIONS.to_dict("records")]
    return train_bpe_tokenizer(prompts + targets, vocab_size=400)


def test_a_runaway_teacher_analysis_is_cut_in_the_target():
    target = text_expmodel.text_expmodel_target({"analysis": "Loved. " * 8_000_000, "overall": 4})
    limit = expmodel_data.MAX_TARGET_ANALYSIS_CHARS
    assert json.loads(target) == {"analysis": ("Loved. " * 300)[:limit].rstrip(), "overall": 4.0}


def test_prompt_inputs_are_the_sft_prompt_left_padded(tokenizer):
    prompts = text_expmodel.text_expmodel_prompts(TEXTS)
    batch = text_expmodel.prompt_inputs(tokenizer, [prompts[1], prompts[6]])
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    for row in range(2):
        ids = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
        assert ids[-len(header) :] == header  # the pooled token is the answer's start
    assert batch["attention_mask"][:, -1].tolist() == [1, 1]  # left padding
    assert "Year: unknown\nGenres: none listed\nTags: none" in prompts[6]


def test_catalogue_pairs_are_oriented_distinct_and_clear_the_margin():
    pairs = expmodel_data.catalogue_pairs(ANNOTATIONS, margin=0.5, max_pairs=100, seed=3)
    overall = ANNOTATIONS.set_index("item_id")["overall"]
    gaps = overall.loc[pairs["pos_item"]].to_numpy() - overall.loc[pairs["neg_item"]].to_numpy()
    assert (gaps >= 0.5 - 1e-9).all()
    # 4.2 4.0 3.1 3.9 2.5: of the 10 pairs all but (1,2), (1,4), (2,4) (gaps 0.2, 0.3, 0.1).
    assert len(pairs) == 10 - 3
    assert not pairs.apply(frozenset, axis=1).duplicated().any()
    # 2 of 7: drawn at random (rejection); 4 of 7: sampled from the enumerated pairs.
    for cap in (2, 4):
        capped = expmodel_data.catalogue_pairs(ANNOTATIONS, margin=0.5, max_pairs=cap, seed=3)
        assert len(capped) == cap
        assert set(capped.itertuples(index=False)) <= set(pairs.itertuples(index=False))


def test_on_reference_scale_keeps_the_order_and_takes_the_reference_moments():
    rng = np.random.default_rng(0)
    scores, reference = rng.normal(5, 0.1, 50), rng.normal(-0.3, 2.2, 400)
    matched = text_expmodel.on_reference_scale(scores, reference)
    np.testing.assert_allclose([matched.mean(), matched.std()], [reference.mean(), reference.std()])
    np.testing.assert_array_equal(np.argsort(matched), np.argsort(scores))


def test_tiny_sft_then_pft_trains_and_scores_every_item(tokenizer):
    torch.set_num_threads(1)
    model = build_tiny_qwen2(
        tokenizer,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    prompts = text_expmodel.text_expmodel_prompts(TEXTS)
    targets = [text_expmodel.text_expmodel_target(r) for r in ANNOTATIONS.to_dict("records")]
    sft_params = {"steps": 3, "batch_size": 2, "max_length": 128, "warmup_steps": 0}
    sft_model, history = run_sft(
        model, tokenizer, [prompts[i] for i in ANNOTATIONS["item_id"]], targets, sft_params
    )
    assert len(history) == 3 and np.isfinite(history["sft/loss"]).all()
    scorer = ExpScorer.from_generator(sft_model)
    before = [p.detach().clone() for p in scorer.parameters()]
    pairs = expmodel_data.catalogue_pairs(ANNOTATIONS, margin=0.5, max_pairs=6)
    training = SupervisedConfig.from_params(
        {"steps": 4, "batch_size": 2, "learning_rate": 1e-2}, **expmodel_data.EXPMODEL_TRAINING
    )
    options = expmodel_pft.PFTOptions(heldout_fraction=0.34, heldout_split="pairs")
    scorer, pft_history, accuracy = text_expmodel.train_text_expmodel_pft(
        scorer, tokenizer, prompts, pairs, training=training, options=options, progress=False
    )
    assert len(pft_history) == 4 and 0.0 <= accuracy <= 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, scorer.parameters(), strict=True))
    # Item 6 has no annotation: the model scores it from its text all the same.
    scores = text_expmodel.score_text_items(scorer, tokenizer, prompts, [6, 1, 2], batch_size=2)
    alone = text_expmodel.score_text_items(scorer, tokenizer, prompts, [6, 1, 2], batch_size=1)
    assert scores["item_id"].tolist() == [6, 1, 2]
    np.testing.assert_allclose(scores["s_exp"], alone["s_exp"], atol=1e-5)  # left padding
    assert scores["s_exp"].nunique() > 1


def test_paired_gains_by_band_by_hand():
    per_session = pd.DataFrame(
        {
            "ranker": ["a"] * 3 + ["a0"] * 3,
            "session_id": [0, 1, 2] * 2,
            "query_frequency_band": ["head", "tail", "tail"] * 2,
            "true_ndcg": [0.5, 0.6, 0.9, 0.4, 0.6, 0.5],
        }
    )
    table = paired_gains_by_band(per_session, {"a": "a0"}).set_index("band")
    # differences 0.1 (head), 0.0 and 0.4 (tail): tail mean 0.2, se std([0, 0.4]) / sqrt(2) = 0.2
    np.testing.assert_allclose(
        table.loc[["head", "tail", "all"], "true_ndcg_gain"], [0.1, 0.2, 1 / 6]
    )
    np.testing.assert_allclose(table.loc["tail", "true_ndcg_gain_se"], 0.2)
    assert table.loc["all", "sessions"] == 3 and (table["reference"] == "a0").all()
    with pytest.raises(ValueError, match="not in the table"):
        paired_gains_by_band(per_session, {"a": "b"})


def test_teacher_agreement_per_split():
    scores = pd.DataFrame({"item_id": [1, 2, 3, 4, 5], "s_exp": [5.0, 4.0, 3.0, 1.0, 2.0]})
    split = pd.DataFrame(
        {"item_id": [1, 2, 3, 4, 5], "split": ["train", "train", "train", "unseen", "unseen"]}
    )
    table = teacher_agreement(scores, ANNOTATIONS, split).set_index("split")
    # train 4.2 > 4.0 > 3.1 in the same order as the scores: tau 1; unseen 3.9 > 2.5 vs 1 < 2.
    assert table["kendall_tau"].tolist() == [1.0, -1.0]
    assert table["items"].tolist() == [3, 2]
