"""Query-aware experience scores s_{q,v} (docs/methods/experience.md, step 3): the query in the
ExpModel's prompt, preference pairs formed per query, scores per (query, candidate) and what
reads them (y_aug's session scores, the evaluation's per-query tau)."""

import numpy as np
import pandas as pd
import pytest
import torch

from creditflow.chain.ab_test.reporting import (
    evaluate_experience_scores,
    mean_query_tau,
    query_truth,
)
from creditflow.chain.annotation import DIMENSIONS, QUERY_COLUMN, HeuristicAnnotator
from creditflow.chain.annotation.heuristic import query_topic
from creditflow.chain.annotation.schema import query_prompt
from creditflow.chain.expmodel.data import (
    PAIR_COLUMNS,
    check_score_mode,
    expmodel_prompt,
    expmodel_target,
    preference_pairs,
    query_candidates,
    split_items,
)
from creditflow.chain.expmodel.scorer import ExpScorer
from creditflow.chain.expmodel.scoring import pair_scores, score_items
from creditflow.chain.expmodel.sft import expmodel_prompts, expmodel_sft_examples
from creditflow.chain.reranker.data import session_exp_scores
from creditflow.chain.world.catalogue import CATEGORY_VOCABULARY, generate_catalogue
from creditflow.models import build_tiny_processor, build_tiny_qwen2_5_vl, train_vl_tokenizer
from tests.chain.expmodel.test_expmodel import IMAGE_SIZE, TINY_VL

# --- the prompt ---------------------------------------------------------------------------------


def test_the_query_closes_the_prompt_and_item_mode_is_unchanged():
    item = expmodel_prompt("cooking", "Pasta tutorial")
    assert "Query" not in item
    assert expmodel_prompt("cooking", "Pasta tutorial", "pasta recipe") == (
        item + "\nQuery: pasta recipe"
    )


def test_an_unknown_score_mode_lists_the_valid_ones():
    assert check_score_mode("query") == "query"
    with pytest.raises(ValueError, match="unknown score_mode 'items'; valid: query, item"):
        check_score_mode("items")


@pytest.fixture(scope="module")
def items():
    return generate_catalogue(6, seed=0, image_size=IMAGE_SIZE)


@pytest.fixture(scope="module")
def query_annotations(items):
    """Every item judged for two queries of two different topics."""
    units = pd.concat([items.assign(query_text="pasta recipe"), items.assign(query_text="guitar")])
    return HeuristicAnnotator().annotate(units)


@pytest.fixture(scope="module")
def processor(items, query_annotations):
    texts = expmodel_prompts(items, query_annotations)
    texts += [expmodel_target(row) for _, row in query_annotations.iterrows()]
    return build_tiny_processor(train_vl_tokenizer(texts * 2, vocab_size=500), IMAGE_SIZE)


def test_sft_examples_are_per_query_and_item_with_the_query_in_the_prompt(
    processor, items, query_annotations
):
    examples = expmodel_sft_examples(processor, items.iloc[:3], query_annotations)
    # Items in items_df order, each item's queries in annotation order; items 3-5 left out.
    assert [e.item_id for e in examples] == [0, 0, 1, 1, 2, 2]
    tokenizer = processor.tokenizer
    by_pair = query_annotations.set_index([QUERY_COLUMN, "item_id"])
    for example, query in zip(examples, ["pasta recipe", "guitar"] * 3, strict=True):
        target = expmodel_target(by_pair.loc[(query, example.item_id)])
        n_target = len(tokenizer(target, add_special_tokens=False)["input_ids"]) + 1
        prompt_text = tokenizer.decode(example.input_ids[:-n_target])
        assert f"Query: {query}" in prompt_text
        # The target is this query's annotation of the item: relevance judged for the query.
        assert tokenizer.decode(example.input_ids[-n_target:-1]) == target
    assert len(expmodel_prompts(items.iloc[:3], query_annotations)) == len(examples)


def test_scores_per_query_differ_for_one_item(processor, items):
    scorer = ExpScorer.from_generator(build_tiny_qwen2_5_vl(processor, seed=0, **TINY_VL))
    torch.nn.init.normal_(scorer.head.weight, std=1.0)
    units = pd.DataFrame({QUERY_COLUMN: ["a b", "pasta", "a b"], "item_id": [2, 2, 4]})
    scores = score_items(scorer, processor, items, batch_size=2, units=units)
    assert list(scores.columns) == [QUERY_COLUMN, "item_id", "s_exp"]
    assert scores[[QUERY_COLUMN, "item_id"]].values.tolist() == units.values.tolist()
    assert scores["s_exp"].iloc[0] != scores["s_exp"].iloc[1]  # same item, another query
    alone = score_items(scorer, processor, items.iloc[[2]], batch_size=2).loc[0, "s_exp"]
    assert scores["s_exp"].iloc[0] != pytest.approx(alone)
    with pytest.raises(ValueError, match="missing from items_df"):
        score_items(scorer, processor, items, units=units.assign(item_id=[2, 2, 99]))


# --- pairs per query ----------------------------------------------------------------------------


def _query_annotations(overall: dict) -> pd.DataFrame:
    """``{(query, item): overall}`` -> a per-(query, item) annotation frame."""
    return pd.DataFrame(
        {
            QUERY_COLUMN: [q for q, _ in overall],
            "item_id": [i for _, i in overall],
            "status": "ok",
            "overall": list(overall.values()),
        }
    )


def test_preference_pairs_per_query_by_hand():
    sessions = pd.DataFrame(
        {
            "session_id": [0, 1, 2, 3],
            "query_text": ["pasta", "guitar", "pasta", "guitar"],
            "query_frequency_band": ["tail", "tail", "tail", "head"],
            "candidates": [[1, 2, 3], [1, 2, 4], [2, 1, 4], [3, 4]],
        }
    )
    # Item 1 is good pasta but off-topic for guitar; item 2 the other way round.
    overall = {
        ("pasta", 1): 4.0,
        ("pasta", 2): 2.5,
        ("pasta", 3): 3.4,
        ("pasta", 4): 1.0,
        ("guitar", 1): 2.0,
        ("guitar", 2): 3.5,
        ("guitar", 4): 3.0,
        ("guitar", 3): 1.0,
    }
    pairs = preference_pairs(sessions, _query_annotations(overall), margin=1.0)
    # Session 0 (pasta): 1-2 = 1.5, 1-3 = 0.6 (out), 3-2 = 0.9 (out).
    # Session 1 (guitar): 2-1 = 1.5, 4-1 = 1.0, 2-4 = 0.5 (out): 1 now loses to 2.
    # Session 2 (pasta): (1, 2) again (kept once), 1-4 = 3.0, 2-4 = 1.5. Session 3 is head.
    expected = [
        ("pasta", 1, 2, 0),
        ("guitar", 2, 1, 1),
        ("guitar", 4, 1, 1),
        ("pasta", 1, 4, 2),
        ("pasta", 2, 4, 2),
    ]
    assert list(pairs.columns) == [QUERY_COLUMN, *PAIR_COLUMNS]
    assert list(pairs.itertuples(index=False, name=None)) == expected
    # The same two items under the two queries: opposite orders, both kept.
    assert {(r[1], r[2]) for r in expected if r[0] == "pasta"} & {(1, 2)}
    assert {(r[1], r[2]) for r in expected if r[0] == "guitar"} & {(2, 1)}


def test_per_query_pairs_need_the_sessions_queries():
    sessions = pd.DataFrame(
        {"session_id": [0], "query_frequency_band": ["tail"], "candidates": [[1, 2]]}
    )
    with pytest.raises(ValueError, match="query_text"):
        preference_pairs(sessions, _query_annotations({("a", 1): 4.0, ("a", 2): 1.0}))


def test_query_candidates_are_distinct_and_need_queries():
    sessions = pd.DataFrame({"query_text": ["a", "b", "a"], "candidates": [[1, 2], [2], [2, 3]]})
    assert query_candidates(sessions).values.tolist() == [["a", 1], ["a", 2], ["b", 2], ["a", 3]]
    with pytest.raises(ValueError, match="score_mode: item"):
        query_candidates(sessions.assign(query_text=["a", None, "b"]))


# --- the annotator judges relevance for the query -------------------------------------------


def test_query_topic_is_the_category_with_most_query_words():
    assert query_topic("pasta recipe", CATEGORY_VOCABULARY) == "cooking"
    assert query_topic("Guitar CHORDS puppy", CATEGORY_VOCABULARY) == "music"
    assert query_topic("nothing known", CATEGORY_VOCABULARY) is None


def test_heuristic_relevance_follows_the_query_and_nothing_else_does():
    items = generate_catalogue(40, seed=0, image_size=64)
    annotator = HeuristicAnnotator()
    alone = annotator.annotate(items).set_index("item_id")
    query = " ".join(CATEGORY_VOCABULARY["cooking"][:2])
    judged = annotator.annotate(items.assign(query_text=query)).set_index("item_id")
    assert (judged[QUERY_COLUMN] == query).all()
    for dim in ("sharpness", "exposure", "noise", "title_informativeness"):
        assert judged[dim].tolist() == alone[dim].tolist()
    cooking = items.set_index("item_id")["category"] == "cooking"
    # On the query's topic it is the item's own relevance; off it, lower (no evidence for it).
    assert judged.loc[cooking, "relevance"].tolist() == alone.loc[cooking, "relevance"].tolist()
    assert judged.loc[~cooking, "relevance"].mean() < alone.loc[~cooking, "relevance"].mean() - 1
    # Overall for the query: the own overall scaled by the query relevance (1 off-topic).
    expected = 1 + (alone["overall"] - 1) * (judged["relevance"].astype(float) - 1) / 4
    np.testing.assert_allclose(judged["overall"], expected.round(2), atol=1e-9)
    assert (judged.loc[judged["relevance"] == 1, "overall"] == 1.0).all()
    assert judged.loc[0, "analysis"].startswith(alone.loc[0, "analysis"])
    assert f"For the query '{query}'" in judged.loc[0, "analysis"]


def test_served_annotators_put_the_query_first():
    assert query_prompt("Rate it.", None) == "Rate it."
    text = query_prompt("Rate it.", "pasta recipe")
    assert text.startswith("Search query: pasta recipe\n") and text.endswith("Rate it.")


# --- what reads s_{q,v} -------------------------------------------------------------------------


def test_session_scores_read_each_candidate_for_its_sessions_query():
    sessions = pd.DataFrame({"query_text": ["a", "b"], "candidates": [[1, 2], [2, 1]]})
    scores = pd.DataFrame(
        {QUERY_COLUMN: ["a", "a", "b", "b"], "item_id": [1, 2, 1, 2], "s_exp": [0.1, 0.2, 0.3, 0.4]}
    )
    # Session 1 (query b) lists item 2 first: s(b, 2) = 0.4, then s(b, 1) = 0.3.
    torch.testing.assert_close(
        session_exp_scores(sessions, scores), torch.tensor([[0.1, 0.2], [0.4, 0.3]])
    )
    with pytest.raises(ValueError, match="have no experience score"):
        session_exp_scores(sessions.assign(query_text=["a", "c"]), scores)
    # Per-item scores stay what they were: the query is not read.
    per_item = pd.DataFrame({"item_id": [1, 2], "s_exp": [0.5, 0.6]})
    torch.testing.assert_close(
        session_exp_scores(sessions, per_item), torch.tensor([[0.5, 0.6], [0.6, 0.5]])
    )


def test_pair_scores_look_up_each_side_for_the_pairs_query():
    scores = pd.DataFrame(
        {QUERY_COLUMN: ["a", "a", "b", "b"], "item_id": [1, 2, 1, 2], "s_exp": [0.1, 0.2, 0.3, 0.4]}
    )
    pairs = pd.DataFrame({QUERY_COLUMN: ["a", "b"], "pos_item": [2, 1], "neg_item": [1, 2]})
    pos, neg = pair_scores(pairs, scores)
    torch.testing.assert_close(pos, torch.tensor([0.2, 0.3], dtype=torch.float64))
    torch.testing.assert_close(neg, torch.tensor([0.1, 0.4], dtype=torch.float64))


def test_mean_query_tau_by_hand():
    frame = pd.DataFrame(
        {
            QUERY_COLUMN: ["a", "a", "a", "b", "b", "c"],
            "s": [1.0, 2.0, 3.0, 1.0, 2.0, 5.0],
            "t": [1.0, 3.0, 2.0, 2.0, 1.0, 0.0],
        }
    )
    # a: pairs (1,2) +, (1,3) +, (2,3) - -> 1/3; b: one discordant pair -> -1; c: one item.
    assert mean_query_tau(frame, "s", "t") == pytest.approx((1 / 3 - 1) / 2)


def test_the_query_row_holds_scores_to_the_per_query_truth():
    truth = {"true_quality": [0.9, 0.5, 0.1]} | {f"true_{d}": [0.9, 0.5, 0.1] for d in DIMENSIONS}
    catalogue = pd.DataFrame({"item_id": [1, 2, 3], **truth})
    sessions = pd.DataFrame(
        {
            "query_text": ["a", "b", "a"],
            "candidates": [[1, 2], [1, 2], [2, 3]],
            # Item 1 is the best item but off-topic for b: its quality for b is 0.
            "true_quality": [[0.9, 0.5], [0.0, 0.5], [0.5, 0.1]],
        }
    )
    assert query_truth(sessions).values.tolist() == [
        ["a", 1, 0.9],
        ["a", 2, 0.5],
        ["b", 1, 0.0],
        ["b", 2, 0.5],
        ["a", 3, 0.1],
    ]
    split = split_items([1, 2, 3], 0.0, seed=0)
    annotations = pd.DataFrame(
        {"item_id": [1, 2, 3], "status": "ok", "overall": [5.0, 3.0, 1.0]}
        | dict.fromkeys(DIMENSIONS, [5, 3, 1])
    )
    pairs = pd.DataFrame(columns=["pos_item", "neg_item", "session_id"])
    aware = pd.DataFrame(
        {
            QUERY_COLUMN: ["a", "a", "a", "b", "b"],
            "item_id": [1, 2, 3, 1, 2],
            "s_exp": [3.0, 2.0, 1.0, -1.0, 2.0],
        }
    )
    table = evaluate_experience_scores(
        catalogue, annotations, aware, split, pairs, sessions=sessions
    ).set_index("target")
    # Query a orders 1 > 2 > 3 as the truth does (tau 1), b orders 2 > 1 (tau 1).
    assert table.loc["query_quality", "kendall_tau_s_exp"] == pytest.approx(1.0)
    assert table.loc["query_quality", "items"] == 5
    # The per-item annotation ranks 1 above 2 under b too: tau (1 + -1) / 2 = 0.
    assert table.loc["query_quality", "kendall_tau_annotation"] == pytest.approx(0.0)
    # Per-item rows read each item's mean s_{q,v}: 1 -> 1.0, 2 -> 2.0, 3 -> 1.0.
    assert table.loc["quality", "items"] == 3
    blind = pd.DataFrame({"item_id": [1, 2, 3], "s_exp": [3.0, 2.0, 1.0]})
    table = evaluate_experience_scores(
        catalogue, annotations, blind, split, pairs, sessions=sessions
    ).set_index("target")
    assert table.loc["quality", "kendall_tau_s_exp"] == pytest.approx(1.0)
    assert table.loc["query_quality", "kendall_tau_s_exp"] == pytest.approx(0.0)
    assert np.isnan(table.loc["query_quality", "pair_accuracy_unseen"])
