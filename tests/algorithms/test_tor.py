import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from creditflow.algorithms import (
    num_selected,
    top_fraction_mask,
    top_fraction_threshold,
    topp_entropy,
    tor,
    tor_token_weights,
    visual_sensitivity,
)


def loop_topp_entropy(logits: torch.Tensor, top_p: float, renormalize: bool) -> torch.Tensor:
    batch, length, _ = logits.shape
    out = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        for t in range(length):
            probs = sorted(torch.softmax(logits[b, t].double(), dim=0).tolist(), reverse=True)
            kept, mass = [], 0.0
            for p in probs:
                kept.append(p)
                mass += p
                if mass >= top_p:
                    break
            if renormalize:
                kept = [p / sum(kept) for p in kept]
            out[b, t] = -sum(p * math.log(p) for p in kept if p > 0)
    return out


def loop_top_fraction(scores: list[list[float]], mask: list[list[int]], fraction: float):
    """Top-k valid tokens by a plain sort; scores must be distinct so the answer is unique."""
    valid = [(s, b, t) for b, row in enumerate(scores) for t, s in enumerate(row) if mask[b][t]]
    k = math.ceil(fraction * len(valid) - 1e-6)
    chosen = {(b, t) for _, b, t in sorted(valid, reverse=True)[:k]}
    return [[(b, t) in chosen for t in range(len(row))] for b, row in enumerate(scores)]


def random_mask(generator, batch, length):
    mask = torch.rand(batch, length, generator=generator) < 0.8
    mask[0, 0] = True
    return mask


# --- topp_entropy -------------------------------------------------------------------------


def test_topp_entropy_hand_computed():
    logits = torch.log(torch.tensor([[[0.2, 0.5, 0.3]]]))
    # top_p = 0.7: sorted (0.5, 0.3, 0.2), mass before each (0, 0.5, 0.8): keep 0.5 and the
    # crossing 0.3; renormalised (0.625, 0.375) -> H = -(0.625 ln 0.625 + 0.375 ln 0.375)
    renormalised = -(0.625 * math.log(0.625) + 0.375 * math.log(0.375))
    assert_close(topp_entropy(logits, top_p=0.7), torch.tensor([[renormalised]]))
    # raw: -(0.5 ln 0.5 + 0.3 ln 0.3)
    raw = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3))
    assert_close(topp_entropy(logits, top_p=0.7, renormalize=False), torch.tensor([[raw]]))
    # top_p = 0.4: the top token alone crosses it -> a point mass, H = 0 (raw: -0.5 ln 0.5)
    assert_close(topp_entropy(logits, top_p=0.4), torch.tensor([[0.0]]))
    assert_close(
        topp_entropy(logits, top_p=0.4, renormalize=False), torch.tensor([[0.5 * math.log(2)]])
    )
    # top_p = 1: the full distribution
    full = -(0.2 * math.log(0.2) + 0.5 * math.log(0.5) + 0.3 * math.log(0.3))
    assert_close(topp_entropy(logits, top_p=1.0), torch.tensor([[full]]))


def test_topp_entropy_uniform_keeps_enough_tokens():
    # uniform over 4: masses before are (0, .25, .5, .75) < 0.95 -> all kept, H = ln 4;
    # top_p = 0.6 keeps three (0.75 >= 0.6) -> ln 3 after renormalising
    logits = torch.zeros(1, 2, 4)
    assert_close(topp_entropy(logits, top_p=0.95), torch.full((1, 2), math.log(4)))
    assert_close(topp_entropy(logits, top_p=0.6), torch.full((1, 2), math.log(3)))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("top_p", [0.3, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("renormalize", [True, False])
def test_topp_entropy_matches_loop(seed, top_p, renormalize):
    generator = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(2, 5, 11, generator=generator)
    expected = loop_topp_entropy(logits, top_p, renormalize).float()
    assert_close(topp_entropy(logits, top_p, renormalize), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_topp_entropy_chunked_equals_unchunked(seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 7, 13, generator=generator)
    whole = topp_entropy(logits, chunk_size=7)
    for chunk_size in (1, 2, 3, 100, None):
        assert torch.equal(topp_entropy(logits, chunk_size=chunk_size), whole)


@pytest.mark.parametrize("top_p", [0.5, 0.95, 0.99])
def test_short_nuclei_skip_the_full_sort_and_equal_it(top_p, monkeypatch):
    """Three kinds of positions: peaked (the top token alone exceeds top_p: entropy 0, not
    sorted), a short nucleus (within the top K: read off topk), flat (fully sorted). Every
    one equals the full-sort reference, and only the flat ones are fully sorted."""
    monkeypatch.setattr(tor, "_TOP_K", 4)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, 50, generator=generator)
    logits[:, 0::3, 0] += 14.0  # peaked
    logits[:, 1::3, :3] += 12.0  # three likely tokens
    probs = logits.softmax(dim=-1)
    reference = tor.nucleus_entropy(probs, top_p, renormalize=True)
    peaked = probs.amax(dim=-1) >= top_p + tor._SURE_MARGIN
    short = probs.topk(4).values.sum(dim=-1) >= top_p + tor._SURE_MARGIN
    assert peaked.any() and (short & ~peaked).any() and (~short).any(), "all three kinds"
    sorted_rows = []
    full_sort = tor.nucleus_entropy
    monkeypatch.setattr(
        tor, "nucleus_entropy", lambda p, *a: sorted_rows.append(len(p)) or full_sort(p, *a)
    )
    assert_close(topp_entropy(logits, top_p), reference, atol=1e-6, rtol=1e-6)
    assert sorted_rows == [int((~short).sum())]
    assert (reference[peaked] == 0).all()


def test_topp_entropy_processes_bounded_chunks(monkeypatch):
    seen = []
    chunk_fn = tor._topp_entropy_chunk

    def recording_chunk(chunk, top_p, renormalize):
        seen.append(tuple(chunk.shape))
        return chunk_fn(chunk, top_p, renormalize)

    monkeypatch.setattr(tor, "_topp_entropy_chunk", recording_chunk)
    # budget 2 * 3 * 10 elements -> chunks of 3 positions of the (2, 8, 10) logits
    monkeypatch.setattr(tor, "_ENTROPY_CHUNK_ELEMENTS", 60)
    topp_entropy(torch.randn(2, 8, 10))
    assert seen == [(2, 3, 10), (2, 3, 10), (2, 2, 10)]


def test_topp_entropy_is_float32_without_grad():
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16, requires_grad=True)
    entropy = topp_entropy(logits)
    assert entropy.dtype == torch.float32
    assert not entropy.requires_grad
    assert_close(entropy, topp_entropy(logits.detach().float()))


def test_topp_entropy_handles_masked_vocabulary():
    logits = torch.tensor([[[0.0, 0.0, -math.inf, -math.inf]]])
    # two equally likely tokens, the rest impossible: ln 2, no NaN from 0 * log 0
    assert_close(topp_entropy(logits, top_p=1.0), torch.tensor([[math.log(2)]]))


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_topp_entropy_rejects_bad_top_p(top_p):
    with pytest.raises(ValueError, match="top_p"):
        topp_entropy(torch.zeros(1, 1, 3), top_p=top_p)


def test_topp_entropy_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"\(B, T, V\)"):
        topp_entropy(torch.zeros(2, 3))


# --- visual_sensitivity -------------------------------------------------------------------


def test_visual_sensitivity_hand_computed():
    with_image = torch.tensor([[-0.5, -2.0, -1.0]])
    without_image = torch.tensor([[-1.5, -0.5, -1.0]])
    # |-0.5 + 1.5|, |-2 + 0.5|, 0
    assert_close(visual_sensitivity(with_image, without_image), torch.tensor([[1.0, 1.5, 0.0]]))


def test_visual_sensitivity_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        visual_sensitivity(torch.zeros(2, 3), torch.zeros(2, 4))


# --- top_fraction_mask --------------------------------------------------------------------


def test_num_selected_avoids_float_noise():
    # ceil(0.7 * 10) = 7, ceil(0.3 * 7) = ceil(2.1) = 3; (0.1 + 0.2) * 50 is
    # 15.000000000000002 in floats but selects 15
    assert num_selected(10, 0.7) == 7
    assert num_selected(50, 0.1 + 0.2) == 15
    assert num_selected(7, 0.3) == 3
    assert num_selected(3, 1 / 3) == 1
    assert num_selected(100, 0.0) == 0
    assert num_selected(0, 0.5) == 0


def test_top_fraction_mask_hand_computed():
    scores = torch.tensor([[3.0, 1.0, 2.0], [5.0, 4.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # 5 valid tokens; fraction 0.4 -> k = 2: scores 5 and 4 (the padded 100 never counts)
    expected = torch.tensor([[False, False, False], [True, True, False]])
    assert torch.equal(top_fraction_mask(scores, mask, 0.4), expected)
    # fraction 0.5 -> k = ceil(2.5) = 3: adds score 3
    expected[0, 0] = True
    assert torch.equal(top_fraction_mask(scores, mask, 0.5), expected)
    assert not top_fraction_mask(scores, mask, 0.0).any()
    assert torch.equal(top_fraction_mask(scores, mask, 1.0), mask.bool())


def test_top_fraction_mask_selects_over_the_whole_batch():
    # all of the top tokens sit in sequence 1: no per-sequence quota
    scores = torch.tensor([[0.1, 0.2, 0.3], [0.9, 0.8, 0.7]])
    selected = top_fraction_mask(scores, torch.ones(2, 3), 0.5)
    assert torch.equal(selected, torch.tensor([[False, False, False], [True, True, True]]))


def test_top_fraction_mask_breaks_ties_uniformly_and_reproducibly():
    scores = torch.tensor([[2.0, 1.0, 1.0, 1.0, 1.0]])
    mask = torch.ones(1, 5)
    # k = ceil(0.6 * 5) = 3: the 2.0 plus two of the four tied 1.0s
    counts = torch.zeros(5)
    for seed in range(400):
        selected = top_fraction_mask(scores, mask, 0.6, torch.Generator().manual_seed(seed))
        assert selected[0, 0] and int(selected.sum()) == 3
        counts += selected[0].float()
    # each tied token is picked with probability 2/4; 400 draws: mean 200, sd 10
    assert ((counts[1:] > 160) & (counts[1:] < 240)).all(), counts
    first = top_fraction_mask(scores, mask, 0.6, torch.Generator().manual_seed(7))
    again = top_fraction_mask(scores, mask, 0.6, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.77, 1.0])
def test_top_fraction_mask_matches_loop(seed, fraction):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(4, 9, generator=generator, dtype=torch.float64)
    mask = random_mask(generator, 4, 9)
    expected = loop_top_fraction(scores.tolist(), mask.int().tolist(), fraction)
    assert top_fraction_mask(scores, mask, fraction).tolist() == expected


@pytest.mark.parametrize("seed", range(6))
def test_top_fraction_mask_with_ties_keeps_order_and_count(seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (5, 8), generator=generator).float()  # many ties
    mask = random_mask(generator, 5, 8)
    selected = top_fraction_mask(scores, mask, 0.3, generator)
    n_valid = int(mask.sum())
    assert int(selected.sum()) == math.ceil(0.3 * n_valid - 1e-6)
    assert not (selected & ~mask).any()
    unselected = mask & ~selected
    assert scores[selected].min() >= scores[unselected].max()


@given(
    st.integers(1, 6),
    st.integers(1, 10),
    st.floats(0.0, 1.0),
    st.integers(0, 2**31 - 1),
)
def test_top_fraction_mask_selects_exactly_k(batch, length, fraction, seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (batch, length), generator=generator).float()
    mask = torch.rand(batch, length, generator=generator) < 0.7
    selected = top_fraction_mask(scores, mask, fraction, generator)
    assert int(selected.sum()) == num_selected(int(mask.sum()), fraction)
    assert not (selected & ~mask).any()


@pytest.mark.parametrize("fraction", [-0.01, 1.01])
def test_top_fraction_mask_rejects_bad_fraction(fraction):
    with pytest.raises(ValueError, match=r"fraction must lie in \[0, 1\]"):
        top_fraction_mask(torch.zeros(2, 2), torch.ones(2, 2), fraction)


def test_top_fraction_mask_rejects_bad_shapes():
    with pytest.raises(ValueError, match="one shape"):
        top_fraction_mask(torch.zeros(2, 2), torch.ones(2, 3), 0.5)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        top_fraction_mask(torch.zeros(4), torch.ones(4), 0.5)


def test_top_fraction_mask_rejects_nan_scores():
    with pytest.raises(ValueError, match="NaN"):
        top_fraction_mask(torch.tensor([[float("nan"), 1.0]]), torch.ones(1, 2), 0.5)


def test_top_fraction_threshold_matches_selection_across_ranks():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 4, 6, generator=generator)  # two "ranks" of (4, 6)
    mask = random_mask(generator, 8, 6).view(2, 4, 6)
    # the threshold over both ranks is the smallest score the global selection keeps
    selected = top_fraction_mask(scores.view(8, 6), mask.view(8, 6), 0.3)
    threshold = top_fraction_threshold(scores, mask, 0.3)
    assert threshold == float(scores.view(8, 6)[selected].min())
    assert int(((scores >= threshold) & mask).sum()) == int(selected.sum())
    assert top_fraction_threshold(scores, mask, 0.0) == math.inf


# --- tor_token_weights --------------------------------------------------------------------


def loop_tor_weights(entropy, sensitivity, mask, *, alpha_r, alpha_p, gamma_r, gamma_p, overlap):
    reasoning = loop_top_fraction(entropy, mask, alpha_r)
    perception = loop_top_fraction(sensitivity, mask, alpha_p)
    weights, sums = [], {"sel_h": [], "unsel_h": [], "sel_s": [], "unsel_s": []}
    n_r = n_p = n_both = n_sel = n_valid = 0
    for b, row in enumerate(entropy):
        weights.append([])
        for t in range(len(row)):
            in_r, in_p = reasoning[b][t], perception[b][t]
            w = gamma_r * in_r + gamma_p * in_p
            if overlap == "reasoning" and in_r and in_p:
                w = gamma_r
            weights[b].append(w)
            if not mask[b][t]:
                continue
            n_valid += 1
            n_r += in_r
            n_p += in_p
            n_both += in_r and in_p
            n_sel += in_r or in_p
            side = "sel" if in_r or in_p else "unsel"
            sums[f"{side}_h"].append(row[t])
            sums[f"{side}_s"].append(sensitivity[b][t])

    def mean(xs):
        return sum(xs) / len(xs) if xs else 0.0

    metrics = {
        "tor/reasoning_frac": n_r / n_valid,
        "tor/perception_frac": n_p / n_valid,
        "tor/selected_frac": n_sel / n_valid,
        "tor/overlap_frac": n_both / n_sel if n_sel else 0.0,
        "tor/entropy_selected": mean(sums["sel_h"]),
        "tor/entropy_unselected": mean(sums["unsel_h"]),
        "tor/sensitivity_selected": mean(sums["sel_s"]),
        "tor/sensitivity_unselected": mean(sums["unsel_s"]),
    }
    return weights, metrics


def test_tor_token_weights_hand_computed():
    entropy = torch.tensor([[4.0, 3.0, 0.5, 9.0], [2.0, 1.0, 0.1, 0.2]])
    sensitivity = torch.tensor([[0.9, 0.1, 0.8, 9.0], [0.2, 0.7, 0.0, 0.3]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    # 7 valid tokens, alpha 0.3 -> k = ceil(2.1) = 3 per set
    # T_r (entropy 4, 3, 2) = {(0,0), (0,1), (1,0)}; T_p (0.9, 0.8, 0.7) = {(0,0), (0,2), (1,1)}
    weights, metrics = tor_token_weights(entropy, sensitivity, mask, 0.3, 0.3, 1.0, 0.5)
    # (0,0) in both: 1 + 0.5; padding (0,3) scores 9 but gets 0
    expected = torch.tensor([[1.5, 1.0, 0.5, 0.0], [1.0, 0.5, 0.0, 0.0]])
    assert_close(weights, expected)
    reasoning_only, _ = tor_token_weights(
        entropy, sensitivity, mask, 0.3, 0.3, 1.0, 0.5, overlap="reasoning"
    )
    expected[0, 0] = 1.0
    assert_close(reasoning_only, expected)
    # selected = 5 of 7 valid tokens, 1 of them in both sets
    assert metrics["tor/reasoning_frac"] == pytest.approx(3 / 7)
    assert metrics["tor/perception_frac"] == pytest.approx(3 / 7)
    assert metrics["tor/selected_frac"] == pytest.approx(5 / 7)
    assert metrics["tor/overlap_frac"] == pytest.approx(1 / 5)
    # selected entropies (4, 3, 0.5, 2, 1), unselected (0.1, 0.2)
    assert metrics["tor/entropy_selected"] == pytest.approx(10.5 / 5)
    assert metrics["tor/entropy_unselected"] == pytest.approx(0.15)
    # selected sensitivities (0.9, 0.1, 0.8, 0.2, 0.7), unselected (0.0, 0.3)
    assert metrics["tor/sensitivity_selected"] == pytest.approx(2.7 / 5)
    assert metrics["tor/sensitivity_unselected"] == pytest.approx(0.15)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("overlap", ["sum", "reasoning"])
def test_tor_token_weights_match_loop(seed, overlap):
    generator = torch.Generator().manual_seed(seed)
    entropy = torch.rand(6, 10, generator=generator, dtype=torch.float64) * 3
    sensitivity = torch.rand(6, 10, generator=generator, dtype=torch.float64)
    mask = random_mask(generator, 6, 10)
    alpha_r, alpha_p = 0.2 + 0.1 * seed, 0.4
    weights, metrics = tor_token_weights(
        entropy, sensitivity, mask, alpha_r, alpha_p, 1.0, 0.5, overlap
    )
    expected_weights, expected_metrics = loop_tor_weights(
        entropy.tolist(), sensitivity.tolist(), mask.int().tolist(),
        alpha_r=alpha_r, alpha_p=alpha_p, gamma_r=1.0, gamma_p=0.5, overlap=overlap,
    )  # fmt: skip
    assert_close(weights, torch.tensor(expected_weights, dtype=torch.float64))
    assert metrics == pytest.approx(expected_metrics)


@given(
    st.integers(1, 5),
    st.integers(1, 8),
    st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
    st.sampled_from(["sum", "reasoning"]),
    st.integers(0, 2**31 - 1),
)
def test_tor_weights_vanish_off_the_selected_sets(batch, length, alphas, overlap, seed):
    alpha_r, alpha_p = alphas
    generator = torch.Generator().manual_seed(seed)
    entropy = torch.randint(0, 3, (batch, length), generator=generator).float()
    sensitivity = torch.rand(batch, length, generator=generator)
    mask = torch.rand(batch, length, generator=generator) < 0.6
    weights, _ = tor_token_weights(
        entropy, sensitivity, mask, alpha_r, alpha_p, 1.0, 0.5, overlap,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    # the same generator seed reproduces the two selections inside the call
    replay = torch.Generator().manual_seed(seed)
    reasoning = top_fraction_mask(entropy, mask, alpha_r, replay)
    perception = top_fraction_mask(sensitivity, mask, alpha_p, replay)
    assert (weights[~(reasoning | perception)] == 0).all()
    assert (weights[~mask] == 0).all()
    assert (weights[reasoning] >= 1.0).all() and (weights[perception & ~reasoning] == 0.5).all()


def test_tor_token_weights_rejects_unknown_overlap():
    with pytest.raises(ValueError, match="unknown overlap 'max'; valid: reasoning, sum"):
        tor_token_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), overlap="max")


def test_tor_token_weights_rejects_bad_alpha_and_shapes():
    with pytest.raises(ValueError, match="alpha_r"):
        tor_token_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), alpha_r=1.2)
    with pytest.raises(ValueError, match="alpha_p"):
        tor_token_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), alpha_p=-0.5)
    with pytest.raises(ValueError, match="one shape"):
        tor_token_weights(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))
