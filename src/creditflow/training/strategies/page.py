"""Page-level GRPO (SPEC 3.5): the engine's ``grpo`` advantage on the page reward
``alpha * R_old + beta * nDCG@k(y, y^s)``, with pages sampled by the ``RerankerPolicy``.

Nothing in the loop is specific to pages: the method is this reward and the config it runs
under (one ``"page"`` reward, one pointer step per candidate). ``grpo_runs.run_page_grpo``
puts them together with the reranker policy.

Shape symbols: ``N`` sessions, ``B`` sampled pages, ``L`` candidates per session.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from creditflow.algorithms import page_reward
from creditflow.rollout.reranker_policy import parse_rankings
from creditflow.training.config import ConfigError, GRPOConfig
from creditflow.training.strategies import validate_strategies

# Set by ``page_grpo_config``, never by parameters: the engine's scalar reward is PageReward's
# "page" (its alpha / beta mix is PageReward's own), and a completion is one pointer step per
# candidate, so its length is L.
DERIVED_GRPO_KEYS = ("rewards", "max_new_tokens")


class PageReward:
    """The page-level GRPO reward ``alpha * R_old + beta * nDCG@k(y, y^s)`` (SPEC 3.5), called
    as the engine's ``RewardFn``.

    Row ``i`` of the tensors belongs to prompt ``i`` of the trainer (``GRPOTrainer(policy,
    prompts=list(range(N)), ...)`` with a ``RerankerPolicy`` over the same sessions). Sessions
    must have all ``L`` candidates real: padding slots would take a share of the ``y^s`` gains.

    Args:
        business_gains: ``(N, L)`` logged-feedback gains per candidate (clicks: ``R_old`` is the
            click nDCG@k).
        exp_scores: ``(N, L)`` experience scores ``s_exp``; their rank gains define ``y^s``.
        alpha: weight of ``R_old``.
        beta: weight of the experience alignment.
        k: nDCG cut-off (>= 1).

    Returns (on call with ``(completions, prompt_index (B,))``): ``{"page", "r_old",
    "exp_ndcg"}``, each ``(B,)``; ``r_old`` and ``exp_ndcg`` are ``page_reward`` with weights
    (1, 0) and (0, 1), so ``page = alpha * r_old + beta * exp_ndcg``.
    """

    def __init__(
        self,
        business_gains: torch.Tensor,
        exp_scores: torch.Tensor,
        alpha: float,
        beta: float,
        k: int,
    ):
        if business_gains.dim() != 2 or business_gains.shape != exp_scores.shape:
            raise ValueError(
                f"business_gains and exp_scores must both have shape (N, L), got "
                f"{tuple(business_gains.shape)} and {tuple(exp_scores.shape)}"
            )
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not (math.isfinite(alpha) and math.isfinite(beta)):
            raise ValueError(f"alpha and beta must be finite, got {alpha}, {beta}")
        self.business_gains = business_gains.float()
        self.exp_scores = exp_scores.float()
        self.alpha, self.beta, self.k = float(alpha), float(beta), int(k)

    def __call__(
        self, completions: list[str], prompt_index: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        rankings = parse_rankings(completions, self.business_gains.shape[1])  # (B, L)
        rows = prompt_index.long().cpu()
        gains, scores = self.business_gains[rows], self.exp_scores[rows]  # (B, L)
        return {
            "page": page_reward(rankings, gains, scores, self.alpha, self.beta, self.k),
            "r_old": page_reward(rankings, gains, scores, 1.0, 0.0, self.k),
            "exp_ndcg": page_reward(rankings, gains, scores, 0.0, 1.0, self.k),
        }


def page_grpo_config(grpo_params: Mapping[str, Any], n_candidates: int) -> GRPOConfig:
    """The ``GRPOConfig`` of page-level GRPO: ``grpo_params`` plus the derived keys (the single
    ``"page"`` reward, ``n_candidates`` = ``L`` pointer steps per completion).

    Raises:
        ConfigError: ``grpo_params`` sets a derived key, or a setting or strategy spec is
            broken.
    """
    derived = sorted(set(grpo_params) & set(DERIVED_GRPO_KEYS))
    if derived:
        raise ConfigError(
            f"reranker_grpo.grpo must not set {derived}: page-level GRPO derives them"
        )
    config = GRPOConfig.from_params(
        {**grpo_params, "rewards": {"page": 1.0}, "max_new_tokens": n_candidates}
    )
    validate_strategies(config)  # a bad advantage / token_weights spec fails before training
    return config
