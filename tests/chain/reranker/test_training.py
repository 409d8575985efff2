"""The generative reranker's engine: features, targets, pre-training, the page reward, the
GRPO policy through the real engine, and evaluation against the hidden truth (docs/methods/experience.md, steps 4-5)."""

import math

import pandas as pd
import pytest
import torch

from creditflow.chain.config import FEATURE_NAMES, PRETRAIN_TRAINING
from creditflow.chain.reranker.model import PointerReranker, RerankerConfig
from creditflow.chain.reranker.page_reward import (
    LoggedClicks,
    PageReward,
    SimulatedFeedback,
    page_reward_of,
)
from creditflow.chain.reranker.policy import (
    RerankerPolicy,
    format_ranking,
    parse_rankings,
)
from creditflow.chain.reranker.ranking import page_reward
from creditflow.chain.reranker.training import (
    augmented_targets,
    click_first_order,
    evaluate_rankings,
    logged_sessions,
    pretrain_reranker,
    session_features,
    summarise_by_band,
    teacher_forcing_nll,
    title_signals,
)
from creditflow.chain.world.catalogue import (
    CATEGORY_VOCABULARY,
    HIDDEN_COLUMNS,
    ClickModel,
    generate_catalogue,
    generate_sessions,
)
from creditflow.rollout import Policy
from creditflow.training import CheckpointStore, GRPOConfig, GRPOTrainer
from creditflow.training.supervised import SupervisedConfig

L = 10
TITLE_FEATURES = ("title_clickbait", "title_filler_share", "title_query_match")


@pytest.fixture(scope="module")
def catalogue() -> pd.DataFrame:
    return generate_catalogue(120, seed=0, image_size=32)


@pytest.fixture(scope="module")
def sessions(catalogue) -> pd.DataFrame:
    return generate_sessions(catalogue, n_queries=20, n_sessions=160, list_length=L, seed=0)


@pytest.fixture(scope="module")
def exp_scores(sessions) -> torch.Tensor:
    """A stand-in for ExpModel scores: the hidden quality plus noise (the tests need scores
    that carry signal; the reranker itself never sees ``true_quality``)."""
    truth = torch.tensor(list(sessions["true_quality"]), dtype=torch.float32)
    return truth + 0.05 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def features(sessions, catalogue, exp_scores):
    return session_features(sessions, catalogue, exp_scores)


def _reranker(seed: int = 0) -> PointerReranker:
    torch.manual_seed(seed)
    return PointerReranker(RerankerConfig(n_features=len(FEATURE_NAMES)))


# ---------------------------------------------------------------- features and targets
def test_session_features_shapes_and_labels(sessions, features):
    feats, mask = features
    assert feats.shape == (len(sessions), L, len(FEATURE_NAMES)) and mask.all()
    one_hot = feats[..., FEATURE_NAMES.index("label_clicked") :]
    for i in (0, 7, 42):
        expected = [("C", "E", "U").index(label) for label in sessions["labels"][i]]
        assert one_hot[i].argmax(dim=-1).tolist() == expected
    position = feats[..., FEATURE_NAMES.index("logged_position")]
    # logged_order[0] is the top of the page: position 0; the last is at (L - 1) / (L - 1).
    first, last = sessions["logged_order"][0][0], sessions["logged_order"][0][-1]
    assert position[0, first] == 0.0 and position[0, last] == 1.0


def test_session_features_never_read_the_hidden_quality(sessions, catalogue, exp_scores, features):
    """Scrambling every hidden column, and dropping them from the item table, changes nothing."""
    scrambled = sessions.assign(
        true_quality=[[0.5] * L] * len(sessions), relevance=[[0.5] * L] * len(sessions)
    )
    visible = catalogue.drop(columns=list(HIDDEN_COLUMNS))
    feats, mask = session_features(scrambled, visible, exp_scores)
    assert torch.equal(feats, features[0]) and torch.equal(mask, features[1])


def test_title_signals_hand_cases():
    # Markers: prefix, "!!!", all caps -> 3 of 3; words wow / this / pasta / recipe: one filler
    # ("this"), two topical words of the query's category.
    assert title_signals("WOW!!! THIS PASTA RECIPE!!!", frozenset({"pasta", "recipe"})) == (
        1.0,
        0.25,
        0.5,
    )
    # No marker; "just" and "stuff" are fillers, "ramen" is off the query's words.
    assert title_signals("Ramen just stuff", frozenset({"pasta"})) == (0.0, 2 / 3, 0.0)
    assert title_signals("", frozenset()) == (0.0, 0.0, 0.0)


def test_title_features_are_the_title_signals(sessions, catalogue, features):
    feats, _ = features
    columns = [FEATURE_NAMES.index(n) for n in TITLE_FEATURES]
    items = catalogue.set_index("item_id")
    for i in (0, 5, 99):
        session = sessions.iloc[i]
        (category,) = {
            c
            for c, words in CATEGORY_VOCABULARY.items()
            if session["query_text"].split()[0] in words
        }
        words = frozenset(CATEGORY_VOCABULARY[category])
        for j, item in enumerate(session["candidates"]):
            expected = title_signals(items.loc[item, "title"], words)
            torch.testing.assert_close(feats[i, j, columns], torch.tensor(expected))
    # Click-bait titles carry the markers the world writes with probability true_clickbait.
    bait = feats[..., FEATURE_NAMES.index("title_clickbait")].flatten()
    truth = torch.tensor(
        items.loc[[c for row in sessions["candidates"] for c in row], "true_clickbait"].to_numpy()
    )
    assert torch.corrcoef(torch.stack([bait.double(), truth]))[0, 1] > 0.6


def test_session_features_pad_short_sessions(sessions, catalogue):
    short = sessions.head(2).copy()
    # Keep the candidates at logged positions 0..5 of session 1 (re-indexed).
    row = short.iloc[1]
    keep = sorted(row["logged_order"][:6])
    short.at[short.index[1], "candidates"] = [row["candidates"][c] for c in keep]
    short.at[short.index[1], "labels"] = [row["labels"][c] for c in keep]
    short.at[short.index[1], "clicks"] = [row["clicks"][c] for c in keep]
    short.at[short.index[1], "logged_order"] = [keep.index(c) for c in row["logged_order"][:6]]
    scores = torch.rand(2, L)
    scores[1, 6:] = float("inf")  # whatever sits in the padded slots must not leak
    feats, mask = session_features(short, catalogue, scores)
    assert mask[0].all() and mask[1].tolist() == [True] * 6 + [False] * 4
    assert torch.isfinite(feats).all() and (feats[1, 6:] == 0).all()
    logs = logged_sessions(short)
    assert logs.logged_order[1, 6:].tolist() == [6, 7, 8, 9]


def test_click_first_order_hand_case():
    # logged order (position -> candidate) [3, 1, 0, 2], clicked {0, 2}:
    # clicked in logged order: 0 (position 2), 2 (position 3); then 3, 1.
    clicked = torch.tensor([[True, False, True, False]])
    assert click_first_order(clicked, torch.tensor([[3, 1, 0, 2]])).tolist() == [[0, 2, 3, 1]]


def test_augmented_targets_put_padding_last():
    # Real candidates 0, 1, 3 (slot 2 is padding, its score would rank it first);
    # clicked {3}; then 0 (0.5) before 1 (0.2); padding 2 last.
    clicked = torch.tensor([[False, False, False, True]])
    scores = torch.tensor([[0.5, 0.2, 9.0, 0.1]])
    mask = torch.tensor([[True, True, False, True]])
    assert augmented_targets(clicked, scores, mask).tolist() == [[3, 0, 1, 2]]


# ---------------------------------------------------------------- pre-training
def _training(steps: int = 3, batch_size: int = 8, learning_rate: float = 1e-3):
    """The chain's pre-training settings (``PRETRAIN_TRAINING``) at a test's size."""
    return SupervisedConfig(
        steps=steps, batch_size=batch_size, learning_rate=learning_rate, **PRETRAIN_TRAINING
    )


@pytest.mark.slow
def test_pretraining_on_y_aug_lowers_nll_and_ranks_clicks_first(sessions, features, exp_scores):
    feats, mask = features
    logs = logged_sessions(sessions)
    targets = augmented_targets(logs.clicks.bool(), exp_scores, mask)
    model = _reranker()
    before = teacher_forcing_nll(model, feats, mask, targets).item()
    history = pretrain_reranker(model, feats, mask, targets, training=_training(80, 32, 1e-2))
    after = teacher_forcing_nll(model, feats, mask, targets).item()
    assert len(history) == 80 and history[-1]["step"] == 80.0
    assert after < 0.25 * before, (before, after)
    greedy, _ = model.sample(feats, mask, greedy=True)
    n_clicked = logs.clicks.sum(dim=1).long()
    clicked_first = [
        bool(logs.clicks[n, greedy[n, : n_clicked[n]]].all()) for n in range(len(sessions))
    ]
    assert sum(clicked_first) / len(clicked_first) > 0.9


def test_pretraining_validates_its_inputs(features):
    feats, mask = features
    with pytest.raises(ValueError, match="need features"):
        pretrain_reranker(_reranker(), feats, mask, torch.zeros(1, 2).long(), training=_training())


def test_pretraining_keeps_its_optimizer_and_resumes_from_checkpoints(
    features, monkeypatch, tmp_path
):
    """AdamW with torch's default weight decay 0.01, constant lr, no clipping; a finished run
    in the store is loaded, not trained again."""
    feats, mask = features
    targets = torch.arange(mask.shape[1]).expand_as(mask).clone()  # (N, L): index order
    optimizers = []
    adamw = torch.optim.AdamW
    monkeypatch.setattr(
        torch.optim, "AdamW", lambda *a, **kw: optimizers.append(kw) or adamw(*a, **kw)
    )
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", None)  # calling it would fail
    store = CheckpointStore(tmp_path)
    model = _reranker()
    training = SupervisedConfig.from_params(
        {"steps": 3, "batch_size": 8, "learning_rate": 1e-3, "seed": 0}, **PRETRAIN_TRAINING
    )
    history = pretrain_reranker(model, feats, mask, targets, training=training, checkpoints=store)
    assert optimizers == [{"lr": 1e-3, "weight_decay": 0.01}]
    assert [row["lr"] for row in history] == [1e-3] * 3 and not model.training
    (run_dir,) = tmp_path.iterdir()

    calls = []
    monkeypatch.setattr(
        "creditflow.chain.reranker.training.teacher_forcing_nll", lambda *a: calls.append(a)
    )
    loaded = _reranker()  # the same starting weights: the same run
    again = pretrain_reranker(loaded, feats, mask, targets, training=training, checkpoints=store)
    assert again == history
    assert calls == [] and not loaded.training
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert [p.name for p in tmp_path.iterdir()] == [run_dir.name]


# ---------------------------------------------------------------- reward
def test_page_reward_hand_case():
    """L = 3, clicks [0, 1, 0], s_exp [0.9, 0.1, 0.5], ranking '1 0 2', k = 2.
    R_old: gains in ranked order [1, 0] -> DCG 1; ideal DCG 1 -> 1.
    y^s rank gains (L - rank) / L: candidate 0 -> 1, 1 -> 1/3, 2 -> 2/3; ranked [1/3, 1]:
    DCG = 1/3 + 1/log2(3) = 0.96426; ideal [1, 2/3]: 1 + (2/3)/log2(3) = 1.42062 -> 0.67876.
    page = 0.3 * 1 + 0.7 * 0.67876 = 0.77513."""
    reward = PageReward(
        LoggedClicks(torch.tensor([[0.0, 1.0, 0.0]]), k=2),
        torch.tensor([[0.9, 0.1, 0.5]]),
        alpha=0.3,
        beta=0.7,
        k=2,
    )
    out = reward(["1 0 2"], torch.tensor([0]))
    exp_ndcg = (1 / 3 + 1 / math.log2(3)) / (1 + (2 / 3) / math.log2(3))
    torch.testing.assert_close(out["r_old"], torch.tensor([1.0]))
    torch.testing.assert_close(out["exp_ndcg"], torch.tensor([exp_ndcg]))
    torch.testing.assert_close(out["page"], torch.tensor([0.3 + 0.7 * exp_ndcg]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_page_reward_matches_page_reward_on_random_rankings(seed):
    g = torch.Generator().manual_seed(seed)
    N, B = 5, 12
    clicks = (torch.rand(N, 6, generator=g) < 0.3).float()
    scores = torch.randn(N, 6, generator=g)
    rows = torch.randint(N, (B,), generator=g)
    rankings = torch.stack([torch.randperm(6, generator=g) for _ in range(B)])
    out = PageReward(LoggedClicks(clicks, k=3), scores, alpha=0.4, beta=0.6, k=3)(
        [format_ranking(r) for r in rankings], rows
    )
    expected = page_reward(rankings, clicks[rows], scores[rows], 0.4, 0.6, 3)
    torch.testing.assert_close(out["page"], expected)
    torch.testing.assert_close(out["page"], 0.4 * out["r_old"] + 0.6 * out["exp_ndcg"])


def _simulated(mode: str = "expected") -> SimulatedFeedback:
    """One session: P(click | examined) 0.2, 0.5, 0.4, P(long | click) 0.1, 0.6, 0.3, depth
    uniform on {1, 2} and position bias 1, so position weights 1, 1/4, 0."""
    return SimulatedFeedback(
        torch.tensor([[0.2, 0.5, 0.4]]),
        torch.tensor([[0.1, 0.6, 0.3]]),
        ClickModel(exposure_depth=(1, 2)),
        long_view_weight=1.0,
        mode=mode,
    )


def test_simulated_r_old_hand_case():
    # Values c * (1 + l): 0.22, 0.8, 0.52; the best page 1, 2, 0 is worth 0.8 + 0.52 / 4 = 0.93.
    # Page 1 2 0: clicks 0.5 + 0.1 = 0.6, long views 0.3 + 0.03 -> (0.6 + 0.33) / 0.93 = 1.
    # Page 0 2 1: clicks 0.2 + 0.1 = 0.3, long views 0.02 + 0.03 -> 0.35 / 0.93.
    reward = PageReward(_simulated(), torch.tensor([[0.9, 0.1, 0.5]]), alpha=0.6, beta=0.4, k=2)
    out = reward(["1 2 0", "0 2 1"], torch.tensor([0, 0]))
    torch.testing.assert_close(out["r_old"], torch.tensor([1.0, 0.35 / 0.93]))
    torch.testing.assert_close(out["clicks"], torch.tensor([0.6, 0.3]))
    torch.testing.assert_close(out["long_views"], torch.tensor([0.33, 0.05]))
    torch.testing.assert_close(out["page"], 0.6 * out["r_old"] + 0.4 * out["exp_ndcg"])


def test_sampled_r_old_is_a_pure_function_that_averages_to_the_expectation():
    reward = _simulated("sampled")
    B = 20_000
    pages = torch.tensor([[0, 2, 1]]).repeat(B, 1)
    rows = torch.zeros(B, dtype=torch.long)
    texts = ["0 2 1"] * B
    first = reward(pages, rows, texts)["r_old"]
    assert torch.equal(first, reward(pages, rows, texts)["r_old"]), "same inputs, same users"
    # One user per page: (clicks + long views) / 0.93 of a page worth 0.35 in expectation;
    # each draw is at most 4 / 0.93, std < 1, so 20k draws put the mean within ~0.01.
    assert first.mean().item() == pytest.approx(0.35 / 0.93, abs=0.03)
    other = reward(pages, rows, ["0 2 1"] * (B - 1) + ["1 2 0"])["r_old"]
    assert not torch.equal(first[:-1], other[:-1]), "other completions, other users"


def test_page_reward_of_reads_the_reward_block(sessions, catalogue, exp_scores):
    block = {
        "alpha": 0.5,
        "beta": 0.5,
        "k": 5,
        "gain_mode": "minmax",
        "r_old": "oracle_expected",
        "long_view_weight": 1.0,
        "feedback_seed": 0,
        "online_user_budget": None,
    }
    reward = page_reward_of(block, sessions, catalogue, exp_scores, ClickModel())
    assert isinstance(reward.business, SimulatedFeedback) and reward.gain_mode == "minmax"
    ranking = exp_scores[:3].argsort(dim=1, descending=True)
    out = reward([format_ranking(r) for r in ranking], torch.arange(3))
    torch.testing.assert_close(out["exp_ndcg"], torch.ones(3))  # y^s itself
    assert ((out["r_old"] > 0) & (out["r_old"] <= 1 + 1e-6)).all()
    logged = page_reward_of(
        {**block, "r_old": "logged_clicks"}, sessions, catalogue, exp_scores, ClickModel()
    )
    assert isinstance(logged.business, LoggedClicks)
    with pytest.raises(ValueError, match="r_old"):
        page_reward_of({**block, "r_old": "clicks"}, sessions, catalogue, exp_scores, ClickModel())


def test_parse_rankings_round_trip_and_errors():
    assert parse_rankings([format_ranking([2, 0, 1])], 3).tolist() == [[2, 0, 1]]
    for bad in ("0 1", "0 1 1", "0 a 2"):
        with pytest.raises(ValueError, match="completion 0"):
            parse_rankings([bad], 3)


# ---------------------------------------------------------------- policy and engine
def test_policy_batch_layout_and_recomputed_logp(features):
    feats, mask = features
    policy = RerankerPolicy(_reranker(1), feats, mask)
    assert isinstance(policy, Policy)
    torch.manual_seed(0)
    batch = policy.sample([3, 9, 3], group_size=4, with_entropy=True)
    assert batch.completion_ids.shape == batch.old_logp.shape == (12, L)
    assert batch.prompt_ids[:, 0].tolist() == [3] * 4 + [9] * 4 + [3] * 4
    assert batch.prompt_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert torch.equal(batch.completion_mask, torch.ones(12, L))
    assert torch.equal(parse_rankings(batch.completion_texts, L), batch.completion_ids)
    assert batch.entropy.shape == (12, L) and (batch.entropy[:, :-1] > 0).all()
    assert torch.all(batch.entropy[:, -1] == 0), "the last real step is forced"
    # A minibatch keeps its features: recomputed log-probs match the sampled ones row by row.
    rows = torch.tensor([11, 0, 5])
    logp, entropy = policy.completion_logprobs(batch.select(rows), with_entropy=True)
    torch.testing.assert_close(logp, batch.old_logp[rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, batch.entropy[rows], atol=1e-5, rtol=1e-5)
    assert logp.requires_grad


@pytest.mark.slow
def test_two_grpo_steps_through_the_engine_change_the_reranker(sessions, features, exp_scores):
    feats, mask = features
    model = _reranker(2)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    config = GRPOConfig.from_params(
        {
            "steps": 2,
            "prompts_per_step": 4,
            "group_size": 4,
            "max_new_tokens": L,
            "rewards": {"page": 1.0},
            "learning_rate": 1e-2,
            "warmup_steps": 0,
            "checkpoint_every": 0,
            "log_samples_every": 1,
            "samples_per_log": 2,
        }
    )
    reward = PageReward(
        LoggedClicks(logged_sessions(sessions).clicks, k=5), exp_scores, alpha=0.5, beta=0.5, k=5
    )
    trainer = GRPOTrainer(
        RerankerPolicy(model, feats, mask),
        list(range(len(sessions))),
        reward,
        config,
        progress=False,
    )
    result = trainer.train()
    assert [row["step"] for row in result.history] == [1.0, 2.0]
    for row in result.history:
        assert all(math.isfinite(v) for v in row.values())
        assert row["adv/abs_mean"] > 0 and row["actor/grad_norm"] > 0
        assert {"reward/page", "reward/r_old", "reward/exp_ndcg", "actor/entropy"} <= set(row)
    assert len(parse_rankings([s["completion"] for s in result.samples], L)) == 4
    unchanged = [k for k, v in model.named_parameters() if torch.equal(v, before[k])]
    assert unchanged == []


# ---------------------------------------------------------------- evaluation
def test_evaluate_rankings_is_one_for_the_ideal_orders(sessions, exp_scores):
    truth = torch.tensor(list(sessions["true_quality"]))
    clicks = logged_sessions(sessions).clicks
    by_truth = evaluate_rankings(truth.argsort(dim=1, descending=True), sessions, exp_scores, k=5)
    by_score = evaluate_rankings(
        exp_scores.argsort(dim=1, descending=True), sessions, exp_scores, k=5
    )
    by_click = evaluate_rankings(clicks.argsort(dim=1, descending=True), sessions, None, k=5)
    assert (by_truth["true_ndcg"] > 1 - 1e-6).all()
    assert (by_score["exp_ndcg"] > 1 - 1e-6).all()
    has_click = clicks.sum(dim=1) > 0
    assert (by_click["click_ndcg"][has_click.numpy()] > 1 - 1e-6).all()
    assert (by_click["click_ndcg"][~has_click.numpy()] == 0).all(), "no click: ideal DCG 0"
    assert "exp_ndcg" not in by_click.columns


@pytest.mark.parametrize("gain_mode", ["rank", "minmax"])
def test_evaluate_rankings_exp_ndcg_is_the_reward_term(sessions, exp_scores, gain_mode):
    # The evaluation's exp_ndcg and the page reward's exp_ndcg use the same y^s gains.
    rankings = torch.stack(
        [
            torch.randperm(L, generator=torch.Generator().manual_seed(i))
            for i in range(len(sessions))
        ]
    )
    table = evaluate_rankings(rankings, sessions, exp_scores, k=5, gain_mode=gain_mode)
    reward = PageReward(
        LoggedClicks(logged_sessions(sessions).clicks, k=5), exp_scores, 0.0, 1.0, 5, gain_mode
    )
    out = reward([format_ranking(r) for r in rankings], torch.arange(len(sessions)))
    torch.testing.assert_close(torch.tensor(table["exp_ndcg"].to_numpy()), out["exp_ndcg"])


def test_evaluate_rankings_unexposed_share_hand_case():
    """Candidates labelled [C, E, U, U]; k = 3. Logged order [0, 1, 2, 3] puts one U in the
    top 3 -> 1/3; the order [3, 2, 0, 1] puts two -> 2/3."""
    frame = pd.DataFrame(
        {
            "session_id": [0, 1],
            "query_frequency_band": ["head", "tail"],
            "candidates": [[10, 11, 12, 13]] * 2,
            "logged_order": [[0, 1, 2, 3]] * 2,
            "labels": [["C", "E", "U", "U"]] * 2,
            "clicks": [[1, 0, 0, 0]] * 2,
            "true_quality": [[0.1, 0.2, 0.9, 0.4]] * 2,
        }
    )
    out = evaluate_rankings(torch.tensor([[0, 1, 2, 3], [3, 2, 0, 1]]), frame, None, k=3)
    torch.testing.assert_close(
        torch.tensor(out["unexposed_top_k_share"].to_list()), torch.tensor([1 / 3, 2 / 3])
    )
    # Session 1 ranks [0.4, 0.9, 0.1] on top: DCG = 0.4 + 0.9/log2 3 + 0.1/2;
    # ideal [0.9, 0.4, 0.2]: 0.9 + 0.4/log2 3 + 0.2/2.
    expected = (0.4 + 0.9 / math.log2(3) + 0.05) / (0.9 + 0.4 / math.log2(3) + 0.1)
    assert out["true_ndcg"][1] == pytest.approx(expected, rel=1e-5)
    assert out["click_ndcg"].tolist() == pytest.approx([1.0, 1 / math.log2(4)])


def test_summarise_by_band_means_and_counts():
    per_session = pd.DataFrame(
        {
            "query_frequency_band": ["tail", "head", "tail", "torso"],
            "true_ndcg": [0.2, 1.0, 0.4, 0.5],
            "click_ndcg": [1.0, 0.0, 0.0, 1.0],
        }
    )
    summary = summarise_by_band(per_session)
    assert summary.index.tolist() == ["head", "torso", "tail", "all"]
    assert summary.loc["tail", "true_ndcg"] == pytest.approx(0.3)
    assert summary.loc["all", "true_ndcg"] == pytest.approx(0.525)
    assert summary["sessions"].tolist() == [1, 1, 2, 4]
    # Standard errors: tail sd(0.2, 0.4) / sqrt(2) = 0.1; one head session has none.
    assert summary.loc["tail", "true_ndcg_se"] == pytest.approx(0.1)
    assert math.isnan(summary.loc["head", "true_ndcg_se"])
    expected = pd.Series([0.2, 1.0, 0.4, 0.5]).std() / 2
    assert summary.loc["all", "true_ndcg_se"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="query_frequency_band"):
        summarise_by_band(per_session.drop(columns="query_frequency_band"))
