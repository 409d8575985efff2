"""The Credit Gym's world: prompt families whose reward is a known function of which
completion tokens are right, so the true credit of every token is computable
(docs/methods/credit_gym.md).

A prompt is a family ``f`` and an "image" value ``c``. A completion is ``T`` content tokens
from a vocabulary of ``V`` symbols, with the closing tag ``</translation>`` after the first
``T // 2`` of them: the tokens before it are the translation segment, the rest the reasoning
segment (TAPO's two segments). Of the ``T`` positions of each family a planted subset is
*decisive*; the others are free (no choice changes the reward). A decisive position ``t`` of
family ``f`` has one right token: ``base[f, t]``, or ``(base[f, t] + c) % V`` when the position
is perception-dependent (right only for a policy that reads the image).

Rewards (per completion, before noise), with ``s_trans`` / ``s_reason`` the share of the
segment's decisive tokens that are right and ``s_all = (s_trans + s_reason) / 2``::

    translation = (1 - 2 * conflict) * s_all + 2 * conflict * s_trans
    reasoning = (1 - 2 * conflict) * s_all + 2 * conflict * s_reason

so their sum is ``s_trans + s_reason`` at every ``conflict``: the objective, and with it the
oracle credit, does not move with the knob; only how the two named rewards split it does (at
0 they are equal and never disagree; at 0.5 each reads only its own segment). Reward noise adds
``N(0, noise^2)`` to each reward.

Oracle credit. Every position is sampled independently given the prompt, and the reward is
linear in the indicators "position t is right", so the change in expected total reward from
the choice ``y_t`` is exact: ``w_t * (1[y_t right] - p_t(right))``, with ``w_t = 1 / n_seg``
for a decisive token of a segment holding ``n_seg`` decisive tokens, and 0 for a free token.

Shape symbols: ``F`` families, ``K`` image values, ``T`` content positions, ``V`` symbols,
``B`` completions, ``L = T + 1`` completion tokens (the closing tag included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TRANSLATION, REASONING = 0, 1
CLOSE_TAG = "</translation>"


@dataclass(frozen=True)
class GymKnobs:
    """One point of the gym's sweep (docs/methods/credit_gym.md).

    decisive_fraction: share of the ``T`` positions that decide the reward (at least one).
    conflict: in [0, 0.5], how far the translation and reasoning rewards separate.
    perception: share of the decisive positions that need the image.
    fork_entropy: share of the decisive positions that are high-entropy after the warm start.
    noise: standard deviation of the Gaussian noise on each reward.
    """

    decisive_fraction: float = 0.2
    conflict: float = 0.25
    perception: float = 0.5
    fork_entropy: float = 0.5
    noise: float = 0.0

    def __post_init__(self) -> None:
        for name in ("decisive_fraction", "perception", "fork_entropy"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.decisive_fraction <= 0:
            raise ValueError("decisive_fraction must be > 0: some token must decide the reward")
        if not 0.0 <= self.conflict <= 0.5:
            raise ValueError(f"conflict must be in [0, 0.5], got {self.conflict}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")


@dataclass(frozen=True)
class GymWorld:
    """The planted truth of one world (hidden from every strategy but the oracle control).

    base: ``(F, T)`` long, the right token of a decisive position before the image shift.
    decisive: ``(F, T)`` bool; perception: ``(F, T)`` bool, decisive positions that need the
    image; high_entropy: ``(F, T)`` bool, positions the warm start leaves near-uniform.
    segment: ``(T,)`` long, TRANSLATION or REASONING.
    """

    knobs: GymKnobs
    n_images: int
    vocab_size: int
    base: torch.Tensor
    decisive: torch.Tensor
    perception: torch.Tensor
    high_entropy: torch.Tensor
    segment: torch.Tensor

    @property
    def n_families(self) -> int:
        return self.base.shape[0]

    @property
    def length(self) -> int:
        return self.base.shape[1]

    @property
    def tag_position(self) -> int:
        """Index of the closing tag among the ``L`` completion tokens."""
        return int((self.segment == TRANSLATION).sum())

    def right_tokens(self, family: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """(B, T) the right token at every position for prompts ``(family, image)``, each (B,)
        (meaningful on decisive positions only)."""
        base = self.base[family]  # (B, T)
        shift = torch.where(self.perception[family], image[:, None], torch.zeros_like(base))
        return (base + shift) % self.vocab_size

    def token_weights(self) -> torch.Tensor:
        """(F, T) ``w_t``: ``1 / n_seg`` on a decisive position of a segment holding ``n_seg``
        decisive positions, 0 on a free one."""
        weights = torch.zeros(self.decisive.shape)
        for seg in (TRANSLATION, REASONING):
            in_seg = self.decisive & (self.segment == seg)[None, :]  # (F, T)
            count = in_seg.sum(1, keepdim=True).clamp(min=1)  # (F, 1)
            weights = weights + in_seg.float() / count
        return weights

    def max_reward(self, family: torch.Tensor) -> torch.Tensor:
        """(B,) the best total reward: 1 per segment that holds a decisive position."""
        total = torch.zeros(family.shape[0])
        for seg in (TRANSLATION, REASONING):
            total += (self.decisive[family] & (self.segment == seg)).any(1).float()
        return total


def build_world(
    knobs: GymKnobs,
    seed: int,
    n_families: int = 8,
    length: int = 30,
    vocab_size: int = 8,
    n_images: int = 4,
) -> GymWorld:
    """A seeded world at ``knobs``: the decisive positions (``ceil(fraction * T)`` per family,
    at least one), which of them need the image and which are high-entropy forks, and as many
    free high-entropy positions as the decisive ones hold low-entropy (so the high-entropy
    share of the positions stays the decisive share: top-fraction entropy selections face the
    same budget at every ``fork_entropy``)."""
    if length < 2:
        raise ValueError(f"length must be >= 2 (one token per segment), got {length}")
    if vocab_size < 2 or n_images < 1:
        raise ValueError("vocab_size must be >= 2 and n_images >= 1")
    gen = torch.Generator().manual_seed(seed)
    n_decisive = min(length, max(1, math.ceil(knobs.decisive_fraction * length)))
    n_perception = round(knobs.perception * n_decisive)
    n_fork = round(knobs.fork_entropy * n_decisive)
    base = torch.randint(vocab_size, (n_families, length), generator=gen)
    decisive = torch.zeros(n_families, length, dtype=torch.bool)
    perception = torch.zeros_like(decisive)
    high = torch.zeros_like(decisive)
    for f in range(n_families):
        order = torch.randperm(length, generator=gen)
        chosen, free = order[:n_decisive], order[n_decisive:]
        decisive[f, chosen] = True
        perception[f, chosen[torch.randperm(n_decisive, generator=gen)[:n_perception]]] = True
        high[f, chosen[torch.randperm(n_decisive, generator=gen)[:n_fork]]] = True
        n_free_high = min(len(free), n_decisive - n_fork)
        high[f, free[:n_free_high]] = True
    segment = torch.full((length,), REASONING, dtype=torch.long)
    segment[: length // 2] = TRANSLATION
    return GymWorld(knobs, n_images, vocab_size, base, decisive, perception, high, segment)


def segment_scores(
    world: GymWorld, family: torch.Tensor, image: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s_trans, s_reason)``, each (B,): the share of each segment's decisive tokens that
    are right (0 for a segment without one). tokens: (B, T) content tokens."""
    right = (tokens == world.right_tokens(family, image)) & world.decisive[family]  # (B, T)
    out = []
    for seg in (TRANSLATION, REASONING):
        in_seg = world.decisive[family] & (world.segment == seg)  # (B, T)
        out.append((right & in_seg).sum(1).float() / in_seg.sum(1).clamp(min=1))
    return out[0], out[1]


def gym_rewards(
    world: GymWorld,
    family: torch.Tensor,
    image: torch.Tensor,
    tokens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """The two named rewards (module docstring), ``translation`` and ``reasoning``, each (B,).

    >>> w = build_world(
    ...     GymKnobs(decisive_fraction=1.0, conflict=0.5, perception=0.0), 0, n_families=1, length=2
    ... )
    >>> r = gym_rewards(w, torch.tensor([0]), torch.tensor([0]), w.base[[0]])
    >>> float(r["translation"]), float(r["reasoning"])
    (1.0, 1.0)
    """
    s_trans, s_reason = segment_scores(world, family, image, tokens)
    c = world.knobs.conflict
    s_all = (s_trans + s_reason) / 2
    rewards = {
        "translation": (1 - 2 * c) * s_all + 2 * c * s_trans,
        "reasoning": (1 - 2 * c) * s_all + 2 * c * s_reason,
    }
    if world.knobs.noise > 0:
        for name, value in rewards.items():
            noise = torch.randn(value.shape, generator=generator) * world.knobs.noise
            rewards[name] = value + noise
    return rewards


def oracle_credit(
    world: GymWorld,
    family: torch.Tensor,
    image: torch.Tensor,
    tokens: torch.Tensor,
    probs: torch.Tensor,
) -> torch.Tensor:
    """(B, T) the exact change in expected total reward from each token's choice:
    ``w_t * (1[y_t right] - p_t(right))`` on decisive tokens, 0 on free ones.

    Args:
        tokens: (B, T) the sampled content tokens.
        probs: (B, T, V) the sampling policy's distribution at every content position.
    """
    right = world.right_tokens(family, image)  # (B, T)
    p_right = probs.gather(2, right[..., None]).squeeze(2)  # (B, T)
    return world.token_weights()[family] * ((tokens == right).float() - p_right)


def expected_total_reward(
    world: GymWorld, family: torch.Tensor, image: torch.Tensor, probs: torch.Tensor
) -> torch.Tensor:
    """(B,) the exact expected total reward ``sum_t w_t * p_t(right)`` of prompts under
    ``probs`` (B, T, V) (reward noise has mean 0)."""
    right = world.right_tokens(family, image)  # (B, T)
    p_right = probs.gather(2, right[..., None]).squeeze(2)  # (B, T)
    return (world.token_weights()[family] * p_right).sum(1)


def all_prompts(world: GymWorld) -> tuple[torch.Tensor, torch.Tensor]:
    """Every prompt of the world, ``(family, image)`` each (F * K,)."""
    family = torch.arange(world.n_families).repeat_interleave(world.n_images)
    image = torch.arange(world.n_images).repeat(world.n_families)
    return family, image


def symbols(vocab_size: int) -> list[str]:
    """The text of each content symbol: ``a``, ``b``, ... (one character each)."""
    if vocab_size > 26:
        raise ValueError(f"vocab_size must be <= 26 (one letter per symbol), got {vocab_size}")
    return [chr(ord("a") + i) for i in range(vocab_size)]
