"""TAPO in the GRPO engine (docs/methods/tapo.md): step-level advantages for translate-then-reason
completions, the location of the translation segment in completion tokens, the option checks,
and the sign-conflict rate of the two rewards.

TAPO's translation segment runs from the first completion token through the token that
completes ``</translation>``. The reward side finds that point as a character offset in the
decoded text (``rewards.translation_segment_end``); ``translation_segment_ids`` finds the token,
for any tokenizer (the closing tag may be one added token or several BPE pieces). Translation
tokens get ``alpha * A_trans + (1 - alpha) * A_reason``, reasoning tokens ``A_reason``.

Shape symbols: ``B`` sequences (prompts x G), ``G`` group size, ``T`` completion tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from creditflow.algorithms import segment_token_advantages, sign_conflict_rate, tapo_advantages
from creditflow.config.grpo import GRPOConfig
from creditflow.rewards import translation_segment_end
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.strategies.base import (
    AdvantageStrategy,
    GroupScaleOptions,
    Metrics,
    RewardMetric,
    Spec,
    parse_options,
    spec_scale_by_std,
)

TRANSLATION, REASONING, PADDING = 0, 1, -1


def first_token_reaching(token_ids: list[int], tokenizer, prefix: str) -> int | None:
    """Smallest t such that the decoding of ``token_ids[: t + 1]`` contains ``prefix`` in full
    as its start, i.e. the token that completes ``prefix``; None when no prefix of the tokens does.

    Binary search over t: "the decoded prefix starts with ``prefix``" is monotone in t once the
    prefix is reached (more tokens only append text).
    """

    def reaches(t: int) -> bool:
        return tokenizer.decode(token_ids[: t + 1], skip_special_tokens=True).startswith(prefix)

    if not token_ids or not reaches(len(token_ids) - 1):
        return None
    lo, hi = 0, len(token_ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def translation_segment_ids(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, texts: list[str], tokenizer
) -> torch.Tensor:
    """(B, T) long segment ids: 0 translation, 1 reasoning, -1 padding.

    completion_ids, completion_mask: (B, T); texts: the B decoded completions.
    A completion without ``</translation>`` is all translation segment.
    """
    segment_ids = torch.full_like(completion_ids, TRANSLATION)
    for row, text in enumerate(texts):
        end_char = translation_segment_end(text)
        if end_char is None:
            continue
        n_valid = int(completion_mask[row].sum())
        ids = completion_ids[row, :n_valid].tolist()
        end_token = first_token_reaching(ids, tokenizer, text[:end_char])
        if end_token is not None:
            segment_ids[row, end_token + 1 :] = REASONING
    return segment_ids.masked_fill(completion_mask == 0, PADDING)


# ---------------------------------------------------------------- the advantage strategy
class TapoOptions(GroupScaleOptions):
    alpha: float = Field(
        0.5, ge=0.0, le=1.0, description="weight of A_trans on the translation tokens"
    )
    translation_reward: str = Field(
        "translation", description="the reward whose advantage is A_trans"
    )
    reasoning_reward: str = Field("reasoning", description="the reward whose advantage is A_reason")


def tapo_options(spec: Spec) -> TapoOptions:
    return parse_options(spec, TapoOptions, "advantage")


def tapo_reward_names(spec: Spec) -> tuple[str, str]:
    """(translation reward, reasoning reward) a TAPO spec reads."""
    options = tapo_options(spec)
    return options.translation_reward, options.reasoning_reward


def tapo_alpha(spec: Spec) -> float:
    """The weight of A_trans on translation tokens (docs/methods/tapo.md)."""
    return tapo_options(spec).alpha


def validate_tapo(spec: Spec, config: GRPOConfig) -> None:
    tapo_options(spec)


def tapo_token_advantages(
    spec: Spec,
    rewards: dict[str, torch.Tensor],
    batch: RolloutBatch,
    policy: Any,
    config: GRPOConfig,
) -> tuple[torch.Tensor, Metrics]:
    """TAPO step-level advantages (docs/methods/tapo.md): translation tokens get
    alpha*A_trans + (1-alpha)*A_reason, reasoning tokens A_reason. -> (B, T)"""
    translation, reasoning = tapo_reward_names(spec)
    adv_trans, adv_reason = tapo_advantages(
        rewards[translation],  # (B,)
        rewards[reasoning],  # (B,)
        batch.group_size,
        float(tapo_alpha(spec)),
        scale_by_std=spec_scale_by_std(spec),
    )
    # Column order follows the segment ids: TRANSLATION = 0, REASONING = 1.
    segment_adv = torch.stack([adv_trans, adv_reason], dim=1)  # (B, 2)
    segment_ids = translation_segment_ids(
        batch.completion_ids, batch.completion_mask, batch.completion_texts, policy.tokenizer
    )  # (B, T)
    token_adv = segment_token_advantages(segment_adv, segment_ids)  # (B, T)
    reasoning_tokens = (segment_ids == REASONING).float().sum()
    return token_adv, {
        "adv/abs_mean": token_adv.abs().sum().item()
        / batch.completion_mask.sum().clamp(min=1).item(),
        "adv/reasoning_token_frac": (
            reasoning_tokens / batch.completion_mask.sum().clamp(min=1)
        ).item(),
    }


class SignConflictRate:
    """``adv/sign_conflict_rate`` (docs/methods/tapo.md): the share of completions whose translation
    and reasoning advantages have opposite signs, the conflict summed GRPO hides. A
    ``RewardMetric``: called with the step's rewards (name -> (B,)) and G; reports nothing
    when either reward is missing. Any run may report it (the tapo pipeline does for every
    strategy it compares); TAPO always does."""

    def __init__(self, translation: str = "translation", reasoning: str = "reasoning"):
        self.translation, self.reasoning = translation, reasoning

    def __call__(self, rewards: dict[str, torch.Tensor], group_size: int) -> Metrics:
        if self.translation not in rewards or self.reasoning not in rewards:
            return {}
        rate = sign_conflict_rate(rewards[self.translation], rewards[self.reasoning], group_size)
        return {"adv/sign_conflict_rate": float(rate)}


def _tapo_reward_metrics(spec: Spec) -> list[RewardMetric]:
    return [SignConflictRate(*tapo_reward_names(spec))]


TAPO = AdvantageStrategy(
    tapo_token_advantages,
    validate_tapo,
    reward_names=lambda spec: set(tapo_reward_names(spec)),
    reward_metrics=_tapo_reward_metrics,
)
