"""The inspector's Monte Carlo deserved credit (training.deserved_credit) on a Credit Gym world,
held against the gym's exact oracle: with a span per token, the estimate's error falls as the
number of continuations K grows, like 1 / sqrt(K), towards the oracle credit."""

from __future__ import annotations

import torch

from creditflow.tasks.credit_gym import GymKnobs, build_world, gym_rewards, oracle_credit
from creditflow.training.deserved_credit import estimate_deserved_credit, span_boundaries

B = 6  # completions, one per prompt


def _setup():
    knobs = GymKnobs(decisive_fraction=0.3, conflict=0.25, perception=0.5)
    world = build_world(knobs, seed=1, n_families=3, length=10, vocab_size=4, n_images=2)
    gen = torch.Generator().manual_seed(0)
    family = torch.arange(B) % world.n_families
    image = torch.arange(B) % world.n_images
    # A policy whose positions are drawn independently given the prompt (as the gym's policy
    # draws them): any distribution will do, the oracle is exact for each.
    probs = torch.softmax(torch.randn(B, world.length, world.vocab_size, generator=gen), -1)
    tokens = torch.multinomial(probs.view(-1, world.vocab_size), 1, generator=gen).view(B, -1)
    return world, family, image, probs, tokens


def _sampler(probs, tokens, generator):
    """K continuations of each prefix: its first ``t`` tokens, the rest drawn from ``probs``."""

    def sample(rows, lengths, k):
        rows_k, lengths_k = rows.repeat_interleave(k), lengths.repeat_interleave(k)
        drawn = torch.multinomial(
            probs[rows_k].reshape(-1, probs.shape[-1]), 1, generator=generator
        ).view(len(rows_k), -1)  # (N*K, T)
        kept = torch.arange(tokens.shape[1])[None] < lengths_k[:, None]
        ids = torch.where(kept, tokens[rows_k], drawn)
        return ids, torch.ones_like(ids, dtype=torch.float)

    return sample


def _scorer(world, family, image):
    def score(rows, ids, mask):
        rewards = gym_rewards(world, family[rows], image[rows], ids)
        return rewards["translation"] + rewards["reasoning"]  # the total the oracle counts

    return score


def test_the_estimate_converges_to_the_gyms_oracle_as_k_grows():
    world, family, image, probs, tokens = _setup()
    oracle = oracle_credit(world, family, image, tokens, probs)  # (B, T)
    mask = torch.ones_like(tokens, dtype=torch.float)
    boundaries = span_boundaries(1, mask)  # a span per token: the token's own credit
    final = _scorer(world, family, image)(torch.arange(B), tokens, mask)
    errors = []
    for k in (4, 64, 1024):
        credit, _ = estimate_deserved_credit(
            _sampler(probs, tokens, torch.Generator().manual_seed(k)),
            _scorer(world, family, image),
            boundaries,
            mask,
            final,
            continuations=k,
        )
        errors.append(float((credit - oracle).pow(2).mean().sqrt()))
    assert errors[0] > errors[1] > errors[2], errors
    # 1 / sqrt(K): 16x the continuations cut the error about 4x (2x allowed for the draw)
    assert errors[2] < errors[1] / 2 < errors[0] / 4, errors
    assert errors[2] < 0.02, errors


def test_free_tokens_get_no_deserved_credit_once_the_draws_agree():
    world, family, image, probs, tokens = _setup()
    mask = torch.ones_like(tokens, dtype=torch.float)
    final = _scorer(world, family, image)(torch.arange(B), tokens, mask)
    credit, _ = estimate_deserved_credit(
        _sampler(probs, tokens, torch.Generator().manual_seed(7)),
        _scorer(world, family, image),
        span_boundaries(1, mask),
        mask,
        final,
        continuations=2048,
    )
    free = ~world.decisive[family]  # (B, T)
    assert credit[free].abs().max() < 0.05
    assert credit[~free].abs().mean() > 5 * credit[free].abs().mean()
