"""Policy-gradient losses: GRPO's clipped surrogate (docs/methods/grpo.md).

Shapes: ``B`` sequences, ``T`` completion tokens. ``mask`` is 1 / True where a token counts
and 0 on padding.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from creditflow.algorithms._masked import masked_mean
from creditflow.algorithms._validate import check_choice, check_ndim, check_same_shape
from creditflow.algorithms.covariance import (
    COVARIANCE_CONTROLS,
    clip_cov_keep,
    kl_cov_selected,
    token_covariance,
)


def _seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    # TRL loss_type="grpo": each sequence averages over its own valid tokens (for ToR that
    # is all of o_i, selected or not); then a plain mean over all B sequences.
    return masked_mean(values, mask, dim=-1).mean()


def _token_mean(values: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    # DAPO / verl default: every valid token of the batch weighs the same.
    return masked_mean(values, mask)


def _seq_mean_token_sum_norm(
    values: torch.Tensor, mask: torch.Tensor, max_len: int
) -> torch.Tensor:
    # Dr. GRPO: a constant denominator B * max_len removes the length bias.
    total = torch.where(mask.bool(), values, torch.zeros_like(values)).sum()
    return total / (values.shape[0] * max_len)


def _seq_mean_token_sum(values: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    # LUSPO (TRL loss_type="luspo"): each sequence sums its tokens, so a sequence-level loss
    # counts as many times as the sequence is long; then a plain mean over the B sequences.
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(-1).mean()


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]] = {
    "seq-mean-token-mean": _seq_mean_token_mean,
    "token-mean": _token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
    "seq-mean-token-sum": _seq_mean_token_sum,
}


def truncated_importance_weights(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token truncated importance-sampling weights for a rollout engine whose sampler is
    not the trained module: ``min(exp(trainer_logp - sampler_logp), cap)`` (TRL's
    ``vllm_importance_sampling_mode="token_truncate"``). They multiply each token's
    policy-gradient loss (not the KL term), as TRL's GRPOTrainer does.

    Args:
        trainer_logp: ``(B, T)`` log-probs of the sampled tokens under the trainer's forward
            at sampling time (``RolloutBatch.old_logp``).
        sampler_logp: ``(B, T)`` the engine's own log-probs of the same tokens
            (``RolloutBatch.sampler_logp``); NaN (not reported) counts as no mismatch.
        mask: ``(B, T)``, 1 on valid tokens.
        cap: the truncation, >= 1.

    Returns:
        ``(B, T)`` weights, no gradient, 1 on padding.

    >>> truncated_importance_weights(
    ...     torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, 0.0]]), torch.ones(1, 2), cap=2.0
    ... )
    tensor([[2.0000, 0.3679]])
    """
    check_same_shape(trainer_logp=trainer_logp, sampler_logp=sampler_logp, mask=mask)
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    diff = torch.nan_to_num((trainer_logp - sampler_logp).detach(), nan=0.0)
    diff = torch.where(mask.bool(), diff, torch.zeros_like(diff))
    return diff.exp().clamp(max=cap)


def sampler_mismatch(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor | None, mask: torch.Tensor
) -> dict[str, float]:
    """How far a rollout engine's sampler log-probs are from the trainer's at sampling time,
    over valid tokens: ``rollout/sampler_logp_abs_diff`` (mean absolute difference) and the
    mean and max of the untruncated per-token ratio (``rollout/is_ratio_*``); empty without a
    valid token, without sampler log-probs (None: the engine reports none) or trainer ones
    (numel 0: unscored). trainer_logp, sampler_logp, mask: ``(B, T)``; NaN counts as no
    mismatch.

    >>> m = sampler_mismatch(torch.tensor([[0.0, -1.0]]), torch.zeros(1, 2), torch.ones(1, 2))
    >>> m["rollout/sampler_logp_abs_diff"], round(m["rollout/is_ratio_mean"], 4)  # (1 + e^-1) / 2
    (0.5, 0.6839)
    """
    if sampler_logp is None or trainer_logp.numel() == 0:
        return {}
    diff = torch.nan_to_num(trainer_logp.detach() - sampler_logp, nan=0.0)[mask.bool()]
    if diff.numel() == 0:
        return {}
    ratio = diff.exp()
    return {
        "rollout/sampler_logp_abs_diff": diff.abs().mean().item(),
        "rollout/is_ratio_mean": ratio.mean().item(),
        "rollout/is_ratio_max": ratio.max().item(),
    }


def micro_batch_share(agg: str, micro_mask: torch.Tensor, mask: torch.Tensor) -> float:
    """What one micro-batch's loss counts for in its minibatch's (gradient accumulation).

    ``policy_loss`` of a micro-batch (some rows of a minibatch), times this share, summed over
    micro-batches that partition the minibatch, is ``policy_loss`` of the whole minibatch, and
    so is the gradient: every ``agg`` of docs/methods/grpo.md is a sum over tokens divided by a
    normaliser, and the share swaps the micro-batch's normaliser for the minibatch's.

    - ``seq-mean-token-mean``: a mean over sequences of per-sequence means, so b_micro / b;
    - ``seq-mean-token-sum-norm``: sum / (rows * max_len), so b_micro / b too;
    - ``seq-mean-token-sum``: a mean over sequences of per-sequence sums, so b_micro / b;
    - ``token-mean``: sum / tokens, so n_micro / n (each count clamped to 1, as ``masked_mean``
      does: an empty micro-batch's loss is 0 and so is its share).

    Args:
        agg: one of ``AGGREGATIONS``.
        micro_mask: ``(b_micro, T)``, the micro-batch's rows of ``mask``.
        mask: ``(b, T)``, the minibatch's mask, 1 / True where a token counts.

    >>> mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    >>> micro_batch_share("seq-mean-token-mean", mask[:1], mask)
    0.25
    >>> micro_batch_share("token-mean", mask[:1], mask)  # 3 of the 6 tokens
    0.5
    """
    check_choice("agg", agg, tuple(AGGREGATIONS))
    if agg == "token-mean":
        return float(micro_mask.bool().sum()) / max(1, int(mask.bool().sum()))
    return micro_mask.shape[0] / mask.shape[0]


def _kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def _kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    # Schulman's unbiased, always non-negative estimator (TRL, verl "low_var_kl").
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _kl_k1,
    "k3": _kl_k3,
}


def _token_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # PPO / GRPO: one ratio per token.
    return log_ratio


def _sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # GSPO (2507.18071, eq. 7 and GSPO-token, eq. 13): the value of every token's log-ratio is
    # its completion's length-normalised log-ratio log s_i = mean_t (logp - old_logp), and its
    # gradient is the token's own: sg[log s_i] + logp - sg[logp] differs from logp - old_logp
    # by a constant, so d/d logp_t = 1 on token t only. With one advantage and weight per
    # sequence this is GSPO's gradient exactly; with per-token ones (TAPO, ToR) each token keeps
    # its own credit, scaled by s_i.
    log_s = masked_mean(log_ratio.detach(), mask, dim=-1).unsqueeze(-1)  # (B, 1)
    return log_s + log_ratio - log_ratio.detach()  # (B, T)


IMPORTANCE_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": _token_log_ratio,
    "sequence": _sequence_log_ratio,
}


# |x| where sigmoid'(x) is half of sigmoid'(0): sigma(1 - sigma) = 1/8 -> x = 2 acosh(sqrt 2).
SAPO_HALF_SLOPE = 1.7627471740390859


@dataclass(frozen=True)
class SurrogateKnobs:
    """The settings the surrogates read; each reads its own (``config.loss_types``)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    max_ratio: float = 5.0
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, knobs: SurrogateKnobs
) -> tuple[torch.Tensor, torch.Tensor]:
    # PPO's pessimistic bound: -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A).
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - knobs.clip_low, 1.0 + knobs.clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _cispo_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, knobs: SurrogateKnobs
) -> tuple[torch.Tensor, torch.Tensor]:
    # CISPO (MiniMax-M1, 2506.13585, eq. 4): the importance weight is clipped and detached and
    # the gradient goes through logp, so no token ever drops out of the update.
    weight = ratio.clamp(max=knobs.max_ratio).detach()
    return -weight * advantages * logp, ratio > knobs.max_ratio


def _sapo_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, knobs: SurrogateKnobs
) -> tuple[torch.Tensor, torch.Tensor]:
    # SAPO (2511.20347): a smooth gate instead of the hard clip, -sigmoid(tau (r - 1)) 4/tau A,
    # with tau_pos for A > 0 and tau_neg otherwise. At r = 1 its gradient is PPO's (-A); it
    # fades as r leaves 1, never to exactly 0. "Active" where the gate's slope has fallen below
    # half its peak (|tau (r - 1)| > 1.76), the soft counterpart of a clipped token.
    tau = torch.where(
        advantages > 0,
        torch.full_like(ratio, knobs.sapo_temperature_pos),
        torch.full_like(ratio, knobs.sapo_temperature_neg),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    return -gate * advantages, (tau * (ratio - 1.0)).abs() > SAPO_HALF_SLOPE


def _unclipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, knobs: SurrogateKnobs
) -> tuple[torch.Tensor, torch.Tensor]:
    # The plain importance-weighted policy gradient -r A, no clip (KL-Cov's surrogate, which
    # holds back only the tokens it selects).
    return -advantages * ratio, torch.zeros_like(ratio, dtype=torch.bool)


# name -> (ratio, advantages, logp, knobs) -> (per-token loss, where the clip or gate is
# active); every tensor (B, T).
SURROGATES: dict[
    str,
    Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, SurrogateKnobs],
        tuple[torch.Tensor, torch.Tensor],
    ],
] = {
    "clip": _clipped_surrogate,
    "cispo": _cispo_surrogate,
    "sapo": _sapo_surrogate,
    "unclipped": _unclipped_surrogate,
}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate of the policy against a frozen reference (docs/methods/grpo.md).

    Args:
        logp: ``(B, T)`` policy log-probs of the sampled tokens.
        ref_logp: ``(B, T)`` reference log-probs of the same tokens.
        kind: ``"k1"`` (``logp - ref_logp``) or ``"k3"``
            (``exp(ref_logp - logp) - (ref_logp - logp) - 1``).

    Returns:
        ``(B, T)`` estimates; padding positions are not masked.

    >>> kl_penalty(torch.tensor([[0.0]]), torch.tensor([[-1.0]]), "k1")
    tensor([[1.]])
    """
    check_choice("kl estimator", kind, tuple(KL_ESTIMATORS))
    check_same_shape(logp=logp, ref_logp=ref_logp)
    return KL_ESTIMATORS[kind](logp, ref_logp)


def _check_scalars(
    clip_low: float, clip_high: float, max_ratio: float, beta: float, max_len: int
) -> None:
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if max_ratio <= 0:
        raise ValueError(f"max_ratio must be > 0, got {max_ratio}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")


def _checked_tensors(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
) -> torch.Tensor:
    """``policy_loss``'s tensors checked for shape; the advantages as (B, T)."""
    check_ndim("logp", logp, 2, "(B, T)")
    check_same_shape(logp=logp, old_logp=old_logp, mask=mask)
    if weights is not None:
        check_same_shape(logp=logp, weights=weights)
    if ref_logp is not None:
        check_same_shape(logp=logp, ref_logp=ref_logp)
    if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
        return advantages[:, None].expand_as(logp)  # (B, T)
    if advantages.shape != logp.shape:
        raise ValueError(
            f"advantages must have shape (B,) or (B, T) = {tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    return advantages


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    logp: torch.Tensor,
    sampling_logp: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """The off-policy sequence mask of DeepSeek-V3.2 (TRL's ``off_policy_mask_threshold``):
    1 where a token is kept, 0 where its sequence is dropped from the policy-gradient term. A
    sequence is dropped when its advantage is negative and the mean over its valid tokens of
    ``sampling_logp - logp`` (the KL from the policy that sampled it to the current one, no
    gradient) exceeds ``threshold``: learning to avoid a completion the policy no longer
    produces does more harm than good. A NaN sampling log-prob (a token the sampler could not
    score) counts as no drift.

    Args:
        advantages: ``(B, T)`` (a per-sequence advantage broadcast over its tokens).
        logp, sampling_logp, mask: ``(B, T)``.
        threshold: the largest mean KL a negative-advantage sequence may have (>= 0).

    Returns:
        ``(B, T)`` 0/1, ``logp``'s dtype.

    >>> adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]])
    >>> logp = torch.zeros(3, 2)
    >>> sampled = torch.tensor([[0.9, 0.9], [0.9, 0.9], [0.1, 0.1]])
    >>> off_policy_sequence_mask(adv, logp, sampled, torch.ones(3, 2), threshold=0.5)
    tensor([[1., 1.],
            [0., 0.],
            [1., 1.]])
    """
    if threshold < 0:
        raise ValueError(f"the off-policy mask's threshold must be >= 0, got {threshold}")
    drift = torch.nan_to_num(sampling_logp - logp.detach(), nan=0.0)
    drift = torch.where(mask.bool(), drift, torch.zeros_like(drift))
    mean_drift = drift.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return ((advantages >= 0) | (mean_drift <= threshold)).to(logp.dtype)  # (B, T)


def policy_loss(  # noqa: PLR0917 - positional order fixed by the public API
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "seq-mean-token-mean",
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    kl: str = "k3",
    max_len: int | None = None,
    importance_level: str = "token",
    surrogate: str = "clip",
    max_ratio: float = 5.0,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    off_policy_threshold: float | None = None,
    sampling_logp: torch.Tensor | None = None,
    covariance: str | None = None,
    covariance_ratio: float = 2e-4,
    clip_cov_lower: float = 1.0,
    clip_cov_upper: float = 5.0,
    kl_cov_coef: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's clipped surrogate with per-token weights and optional KL (docs/methods/grpo.md), and
    the GSPO / CISPO variants (docs/methods/loss_types.md).

    Per token ``l = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)`` with
    ``r = exp(logp - old_logp)``; the loss is ``agg(w * l) + beta * agg(kl)``. With
    ``importance_level="sequence"`` (GSPO) every token's ``r`` has the value of its sequence's
    ``s = exp(mean over valid tokens of (logp - old_logp))`` and the gradient of the token's
    own ratio (GSPO-token); with ``surrogate="cispo"``
    ``l = -sg(min(r, max_ratio)) * A * logp``; with ``surrogate="sapo"``
    ``l = -sigmoid(tau (r - 1)) * 4 / tau * A``, ``tau`` the positive or negative temperature
    by the sign of ``A``.

    Args:
        logp: ``(B, T)`` log-probs under the current policy; gradients flow through it.
        old_logp: ``(B, T)`` log-probs under the sampling policy.
        advantages: ``(B,)`` per-sequence (broadcast over tokens) or ``(B, T)`` per-token.
        mask: ``(B, T)``, 1 / True where a token counts.
        weights: ``(B, T)`` per-token weights ``w`` (ToR); ``None`` means 1.
        clip_low: ``eps_low`` of the clip range.
        clip_high: ``eps_high`` of the clip range.
        agg: ``"seq-mean-token-mean"`` (TRL grpo), ``"token-mean"`` (DAPO),
            ``"seq-mean-token-sum-norm"`` (Dr. GRPO) or ``"seq-mean-token-sum"`` (LUSPO).
        ref_logp: ``(B, T)`` reference log-probs; needed when ``beta > 0``.
        beta: KL coefficient (>= 0).
        kl: KL estimator, ``"k1"`` or ``"k3"``.
        max_len: denominator length of ``seq-mean-token-sum-norm``; defaults to ``T``.
        importance_level: ``"token"`` (PPO / GRPO) or ``"sequence"`` (GSPO), see above.
        surrogate: ``"clip"`` (PPO's clipped surrogate, ``clip_low`` / ``clip_high``),
            ``"cispo"`` (the clipped, detached weight times ``logp``, capped at ``max_ratio``),
            ``"sapo"`` (the soft gate, ``sapo_temperature_pos`` / ``_neg``) or
            ``"unclipped"`` (``-r A``, no clip).
        max_ratio: CISPO's cap on the importance weight (``eps_max``, an absolute ratio).
        sapo_temperature_pos: SAPO's gate temperature where ``A > 0`` (> 0).
        sapo_temperature_neg: SAPO's gate temperature where ``A <= 0`` (> 0).
        off_policy_threshold: the off-policy sequence mask's KL threshold
            (``off_policy_sequence_mask``); None: no mask.
        sampling_logp: ``(B, T)`` the sampler's own log-probs the mask measures the drift
            from (NaN where unscored); None or empty (an engine that reports none):
            ``old_logp``.
        covariance: ``"clip_cov"`` or ``"kl_cov"`` (``algorithms.covariance``), None: off.
            Clip-Cov zeroes the policy-gradient term of a random ``covariance_ratio`` share of
            the valid tokens (at least one) whose covariance lies in ``(clip_cov_lower,
            clip_cov_upper)`` and whose clip is not already active; KL-Cov adds
            ``kl_cov_coef * |logp - old_logp|`` to the top ``covariance_ratio`` share by
            covariance. Both before the token weights, over this call's tokens.
        generator: Clip-Cov's random draw (None: torch's global stream).

    Returns:
        ``(loss, metrics)``: a scalar loss and python-float metrics ``actor/pg_loss``,
        ``actor/clip_frac`` (share of valid tokens where the clip is active: the clipped
        term of ``clip``, the cap of ``cispo``, a gate past half its slope for ``sapo``),
        ``actor/ratio_mean``, ``actor/kl`` (mean estimate over valid tokens; 0 without
        ``ref_logp``), with the mask ``actor/off_policy_masked`` (share of sequences it
        drops) and with a covariance control ``actor/cov_selected`` (share of valid tokens
        it selected).
    """
    check_choice("agg", agg, tuple(AGGREGATIONS))
    check_choice("kl estimator", kl, tuple(KL_ESTIMATORS))
    check_choice("importance_level", importance_level, tuple(IMPORTANCE_LEVELS))
    check_choice("surrogate", surrogate, tuple(SURROGATES))
    if covariance is not None:
        check_choice("covariance", covariance, COVARIANCE_CONTROLS)
        if kl_cov_coef < 0:
            raise ValueError(f"KL-Cov's coef must be >= 0, got {kl_cov_coef}")
    advantages = _checked_tensors(logp, old_logp, advantages, mask, weights, ref_logp)
    max_len = logp.shape[1] if max_len is None else max_len
    _check_scalars(clip_low, clip_high, max_ratio, beta, max_len)
    if sapo_temperature_pos <= 0 or sapo_temperature_neg <= 0:
        raise ValueError(
            f"SAPO's temperatures must be > 0, got {sapo_temperature_pos}, {sapo_temperature_neg}"
        )
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp; pass reference log-probs or set beta=0")

    valid = mask.bool()
    aggregate = AGGREGATIONS[agg]
    ratio = torch.exp(IMPORTANCE_LEVELS[importance_level](logp - old_logp, valid))  # (B, T)
    knobs = SurrogateKnobs(
        clip_low, clip_high, max_ratio, sapo_temperature_pos, sapo_temperature_neg
    )
    per_token, clip_active = SURROGATES[surrogate](ratio, advantages, logp, knobs)  # (B, T)
    selected = None
    if covariance is not None:
        per_token, selected = _covariance_control(
            per_token,
            clip_active,
            logp,
            old_logp,
            advantages,
            mask,
            covariance,
            covariance_ratio,
            (clip_cov_lower, clip_cov_upper),
            kl_cov_coef,
            generator,
        )
    if weights is not None:
        per_token = weights * per_token
    kept = None
    if off_policy_threshold is not None:
        unscored = sampling_logp is None or sampling_logp.numel() == 0
        drift_from = old_logp if unscored else sampling_logp
        kept = off_policy_sequence_mask(advantages, logp, drift_from, mask, off_policy_threshold)
        per_token = per_token * kept  # (B, T): the KL term below is not masked, as in TRL
    pg_loss = aggregate(per_token, valid, max_len)
    loss = pg_loss

    kl_mean = 0.0
    if ref_logp is not None:
        per_token_kl = kl_penalty(logp, ref_logp, kl)
        kl_mean = float(masked_mean(per_token_kl.detach(), valid))
        if beta > 0:
            loss = loss + beta * aggregate(per_token_kl, valid, max_len)

    with torch.no_grad():
        metrics = {
            "actor/pg_loss": pg_loss.item(),
            "actor/clip_frac": float(masked_mean(clip_active.to(ratio.dtype), valid)),
            "actor/ratio_mean": float(masked_mean(ratio, valid)),
            "actor/kl": kl_mean,
        }
        if selected is not None:
            metrics["actor/cov_selected"] = float(masked_mean(selected.to(ratio.dtype), valid))
        if kept is not None:
            dropped = (kept.masked_fill(~valid, 1.0).amin(dim=1) == 0).to(ratio.dtype)  # (B,)
            metrics["actor/off_policy_masked"] = float(dropped.mean())
    return loss, metrics


def _covariance_control(  # noqa: PLR0917 - the private helper of policy_loss
    per_token: torch.Tensor,
    clip_active: torch.Tensor,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    name: str,
    ratio: float,
    band: tuple[float, float],
    coef: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_token`` (B, T) after Clip-Cov or KL-Cov, and the (B, T) bool tokens selected."""
    covariance = token_covariance(logp, advantages, mask)
    if name == "clip_cov":
        clipped = clip_active & mask.bool()
        keep = clip_cov_keep(covariance, mask, clipped, ratio, band[0], band[1], generator)
        return per_token * keep, keep == 0
    selected = kl_cov_selected(covariance, mask, ratio)
    penalty = coef * (logp - old_logp).abs()
    return torch.where(selected, per_token + penalty, per_token), selected
