"""The rerankers' settings without torch: the features a reranker reads, its architecture
(:class:`RerankerConfig`), the four rerankers ``reranker_pretrain`` trains and their training
settings, page-level GRPO's reward sources and config, and the simulated A/B's methods. The
parameter check reads them before torch loads (``hooks.parameter_check``); the reranker
engine (``chain.reranker.model``, ``chain.reranker.training``, ``chain.reranker.page_reward``,
``chain.ab_test.simulated_ab``) imports them from here. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError

# --- pre-training (docs/methods/experience.md, step 4) -------------------------------------------

# Columns of the last axis of ``chain.reranker.training.session_features``; each is 0 on
# padding.
FEATURE_NAMES = (
    "exp_score",  # s_exp of the candidate (0 when no scores are given)
    "exp_rank_gain",  # (L - rank) / L of s_exp within the session: the y^s gain of docs/methods/experience.md, step 5
    "log_popularity_z",  # log(popularity), z-scored over the item table
    "category_match",  # 1 when the item's category is the one the query's words name
    "logged_position",  # position in the logged order / (L - 1)
    "logged_reciprocal_rank",  # 1 / (position + 1): the position bias of the logged page
    # Content signals of the title (every reranker reads the same ones).
    "title_clickbait",  # share of the 3 click-bait markers: a known prefix, "!!!", all caps
    "title_filler_share",  # share of the title's words that are vague fillers ("this", "stuff")
    "title_query_match",  # share of the title's words that are topical words of the query's
    # category (0 when no word of the query names one)
    "label_clicked",  # one-hot of the logged label C / E / U
    "label_exposed",
    "label_unexposed",
)
# The chain's ``SupervisedConfig`` settings for pre-training, under the YAML's ``training`` keys
# (``SupervisedConfig.from_params(params, **PRETRAIN_TRAINING)``): AdamW at a constant learning
# rate with weight decay 0.01 (torch's default, what this was tuned with), no clipping.
PRETRAIN_TRAINING = {"schedule": "constant", "weight_decay": 0.01, "max_grad_norm": None}
# The rerankers of ``reranker_pretrain``: name (its model is reranker_<name>) -> its target
# (table reranker_targets_<target>).
RERANKERS = {"yaug": "yaug", "click": "click", "click_exp": "click", "yaug_no_exp": "yaug"}


@dataclass(frozen=True)
class RerankerConfig:
    """Architecture of a :class:`~creditflow.chain.reranker.model.PointerReranker`; saved as
    ``config.json`` beside the weights.

    n_features: ``F``, features per candidate.
    d_model: ``D``, width of the encoder and the decoder state (divisible by ``n_heads``).
    n_heads: attention heads of the encoder.
    n_layers: Transformer encoder layers.
    dim_feedforward: hidden width of the encoder's feed-forward blocks.
    dropout: encoder dropout. 0 by default so a sampled page and its recomputed log-probs
        describe the same distribution in train and eval mode.
    """

    n_features: int
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 1
    dim_feedforward: int = 64
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n_features", "d_model", "n_heads", "n_layers", "dim_feedforward"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @classmethod
    def from_dict(cls, values: dict) -> RerankerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown reranker config key(s) {unknown}; valid: {sorted(known)}")
        return cls(**values)


# --- page-level GRPO (docs/methods/experience.md, step 5) ----------------------------------------

# The gains of the ideal order y^s (``chain.reranker.ranking.rank_gains``).
GAIN_MODES = ("rank", "minmax")
# Where R_old, the business objective of a sampled page, comes from (``reranker_grpo.reward.r_old``;
# ``chain.reranker.page_reward`` says what each is).
FITTED, ORACLE_EXPECTED, ONLINE_SAMPLED, LOGGED_CLICKS = (
    "fitted_click_model",
    "oracle_expected",
    "online_sampled",
    "logged_clicks",
)
R_OLD_SOURCES = (FITTED, ORACLE_EXPECTED, ONLINE_SAMPLED, LOGGED_CLICKS)
# Set by ``page_grpo_config``, never by parameters: the engine's scalar reward is PageReward's
# "page" (its alpha / beta mix is PageReward's own), and a completion is one pointer step per
# candidate, so its length is L.
DERIVED_GRPO_KEYS = ("rewards", "max_new_tokens")


def page_grpo_config(grpo_params: Mapping[str, Any], n_candidates: int) -> GRPOConfig:
    """The ``GRPOConfig`` of page-level GRPO: ``grpo_params`` plus the derived keys (the single
    ``"page"`` reward, ``n_candidates`` = ``L`` pointer steps per completion). Its advantage and
    token-weight strategies are checked where they live, by
    ``training.strategies.validate_strategies`` (torch): before a run's first node
    (``hooks.parameter_check``) and when the trainer is built.

    Raises:
        ConfigError: ``grpo_params`` sets a derived key, or a setting is broken.
    """
    derived = sorted(set(grpo_params) & set(DERIVED_GRPO_KEYS))
    if derived:
        raise ConfigError(
            f"reranker_grpo.grpo must not set {derived}: page-level GRPO derives them"
        )
    return GRPOConfig.from_params(
        {**grpo_params, "rewards": {"page": 1.0}, "max_new_tokens": n_candidates}
    )


# --- the simulated A/B (``chain.ab_test.simulated_ab``) --------------------------------------------

# "exact": the expected clicks and long views of a page, summed over positions; "monte_carlo":
# the same with common-random-number draws (the exact path's parity check).
AB_METHODS = ("exact", "monte_carlo")


# --- the ExpModel's vision pre-training (docs/methods/experience.md, step 2) -----------------


@dataclass(frozen=True)
class VisionPretraining:
    """``expmodel_sft.vision_pretraining``: the self-supervised pre-training of the ExpModel's
    vision tower (``chain.expmodel.vision_pretraining``).

    steps: optimizer steps (0: no pre-training).
    batch_size: covers per step.
    learning_rate: AdamW learning rate of the tower and the head.
    n_images: covers rendered for it (a catalogue of ``n_images`` items, seed ``seed``).
    seed: the catalogue's seed and the degradations'.
    max_blur_radius: blur radius drawn uniformly on ``[0, max]`` (pixels at the cover's size).
    max_log_gain: log brightness gain drawn uniformly on ``[-max, max]``.
    max_noise_std: pixel-noise std drawn uniformly on ``[0, max]`` (grey levels).
    """

    steps: int = 0
    batch_size: int = 16
    learning_rate: float = 3e-3
    n_images: int = 1000
    seed: int = 1000
    max_blur_radius: float = 4.0
    max_log_gain: float = 0.5
    max_noise_std: float = 12.0

    def __post_init__(self) -> None:
        for name, least in (("steps", 0), ("batch_size", 1), ("n_images", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        for name in ("learning_rate", "max_blur_radius", "max_log_gain", "max_noise_std"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")

    @property
    def scales(self) -> tuple[float, float, float]:
        """The range of each degradation (blur, log gain, noise), to regress them on one
        scale."""
        return (self.max_blur_radius, self.max_log_gain, self.max_noise_std)
