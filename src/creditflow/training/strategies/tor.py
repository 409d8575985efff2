"""ToR in the GRPO engine (docs/methods/tor.md): batch-global token selection, also across DDP
processes, and the ``tor`` token-weight strategy with its ablations.

Shape symbols: ``B`` sequences (this process's share under DDP), ``T`` completion tokens.
Masks are 1 where a token counts.

Selection across processes. docs/methods/tor.md picks ``T_r`` and ``T_p`` among all valid tokens of
the rollout batch; with data parallelism each process holds only its own rows. Every process
therefore gathers all processes' scores (padded to one length), takes the global threshold
with ``top_fraction_threshold`` and keeps its tokens above it, plus the tokens *at* it whose
random tie-breaking key is small enough for exactly ``k = ceil(fraction * n_valid)`` tokens
to be selected over the whole batch. The keys come from one draw over the concatenated batch
(every process holds the same seeded generator), so in a single process the result is exactly
``algorithms.top_fraction_mask`` (and the weights exactly ``algorithms.tor_token_weights``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import torch
from pydantic import Field

from creditflow.algorithms import (
    OVERLAP_MODES,
    num_selected,
    top_fraction_threshold,
    tor_weights_from_selection,
    visual_sensitivity,
)
from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.strategies.base import (
    Metrics,
    Spec,
    StrategyOptions,
    TokenWeightStrategy,
    WeightContext,
    parse_options,
)


class TorOptions(StrategyOptions):
    """ToR's options, at the paper's defaults (docs/methods/tor.md)."""

    alpha_r: float = Field(0.3, ge=0.0, le=1.0, description="share of tokens in T_r (entropy)")
    alpha_p: float = Field(
        0.3, ge=0.0, le=1.0, description="share of tokens in T_p (image sensitivity)"
    )
    gamma_r: float = Field(1.0, ge=0.0, description="weight of a T_r token")
    gamma_p: float = Field(0.5, ge=0.0, description="weight of a T_p token")
    overlap: Literal[OVERLAP_MODES] = Field(  # type: ignore[valid-type]
        "sum", description="weight of a token in both sets: sum of both, or gamma_r only"
    )
    top_p: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="the entropy's top-p; checked, not set, here: it must equal entropy_top_p",
    )


# Ablations by name: each fixes some options (they may not be set again in the config).
TOR_PRESETS: dict[str, dict[str, Any]] = {
    "tor": {},
    "tor_reasoning_only": {"gamma_p": 0.0},  # T_r alone
    "tor_perception_only": {"gamma_r": 0.0},  # T_p alone
}


# ---------------------------------------------------------------- batch-global selection
def gather_processes(accelerator: Any, tensor: torch.Tensor) -> torch.Tensor:
    """Every process's ``tensor`` concatenated along dim 0, in process order (on CPU)."""
    if accelerator is None or accelerator.num_processes == 1:
        return tensor
    return accelerator.gather(tensor.to(accelerator.device)).cpu()


def uniform_draw_over_processes(
    n: int, generator: torch.Generator | None, accelerator: Any
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """One uniform draw over the positions of every process's rollout rows, this process
    holding ``n`` of them. Each process holds the same seeded generator, so all draw alike and
    each takes its own stretch: no two processes' positions share a key.

    Returns:
        ``(draw, offset, sizes)``: the whole draw ``(total,)``, where this process's stretch
        starts in it, and the positions per process ``(R,)``.
    """
    sizes = gather_processes(accelerator, torch.tensor([n]))  # (R,) positions per process
    rank = 0 if accelerator is None else accelerator.process_index
    return torch.rand(int(sizes.sum()), generator=generator), int(sizes[:rank].sum()), sizes


def batch_top_fraction_mask(
    scores: torch.Tensor,
    mask: torch.Tensor,
    fraction: float,
    generator: torch.Generator | None = None,
    accelerator: Any = None,
) -> torch.Tensor:
    """``top_fraction_mask`` over the rollout batch of *all* processes (docs/methods/tor.md).

    Exactly ``k = ceil(fraction * n_valid)`` tokens are selected over all processes (``n_valid``
    summed over them); ties at the threshold are broken by random keys drawn from
    ``generator`` over the concatenated batch; padding is never selected.

    Args:
        scores: ``(B, T)`` this process's scores (compared in float32).
        mask: ``(B, T)``, 1 / True where a token counts.
        fraction: share of the valid tokens to select, in [0, 1].
        generator: seeded identically on every process (the trainer's step generator).
        accelerator: an ``accelerate.Accelerator`` (``gather``, ``num_processes``,
            ``process_index``); ``None`` is a single process.

    Returns:
        ``(B, T)`` bool, True on this process's selected tokens. With one process it equals
        ``algorithms.top_fraction_mask(scores, mask, fraction, generator)``.
    """
    if scores.dim() != 2 or scores.shape != mask.shape:
        raise ValueError(
            f"scores and mask must both be (B, T); got {tuple(scores.shape)}, {tuple(mask.shape)}"
        )
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    flat = scores.detach().reshape(-1).float().cpu()  # (B*T,)
    valid = mask.detach().reshape(-1).bool().cpu()  # (B*T,)
    if torch.isnan(flat[valid]).any():
        raise ValueError("scores must not be NaN on valid tokens")
    n = flat.numel()
    # Tie-breaking keys: one uniform draw over the concatenated batch, turned into distinct
    # integer ranks (the order top_fraction_mask breaks ties in: smaller key first).
    draw, offset, sizes = uniform_draw_over_processes(n, generator, accelerator)
    total = draw.numel()
    key_rank = torch.empty(total, dtype=torch.long)
    key_rank[draw.argsort()] = torch.arange(total)
    keys = key_rank[offset : offset + n]  # (B*T,)

    # float64 holds every float32 score and every key exactly.
    packed = torch.zeros(1, int(sizes.max()), 3, dtype=torch.float64)
    packed[0, :n, 0] = flat.double()
    packed[0, :n, 1] = valid.double()
    packed[0, :n, 2] = keys.double()
    # (R * width, 3), padding invalid
    everyone = gather_processes(accelerator, packed).reshape(-1, 3)
    all_scores, all_valid, all_keys = everyone[:, 0], everyone[:, 1].bool(), everyone[:, 2]

    k = num_selected(int(all_valid.sum()), fraction)
    if k == 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    threshold = top_fraction_threshold(all_scores, all_valid, fraction)  # a float32 value
    n_above = int((all_valid & (all_scores > threshold)).sum())
    tied_keys = all_keys[all_valid & (all_scores == threshold)]
    key_limit = tied_keys.kthvalue(k - n_above).values  # the (k - n_above)-th smallest key
    selected = valid & ((flat > threshold) | ((flat == threshold) & (keys <= key_limit)))
    return selected.view(mask.shape).to(mask.device)


def batch_tor_token_weights(
    entropy: torch.Tensor,
    sensitivity: torch.Tensor,
    mask: torch.Tensor,
    alpha_r: float = 0.3,
    alpha_p: float = 0.3,
    gamma_r: float = 1.0,
    gamma_p: float = 0.5,
    overlap: str = "sum",
    generator: torch.Generator | None = None,
    accelerator: Any = None,
) -> tuple[torch.Tensor, Metrics]:
    """``algorithms.tor_token_weights`` with both selections taken over all processes.

    ``w = gamma_r * 1[T_r] + gamma_p * 1[T_p]`` (``overlap="reasoning"``: ``gamma_r`` on
    ``T_r & T_p``), 0 elsewhere (docs/methods/tor.md). ``T_r`` is drawn first, then ``T_p``, from
    the same ``generator``, as in ``tor_token_weights``, which this equals in one process.

    Args:
        entropy: ``(B, T)`` top-p entropies; sensitivity: ``(B, T)`` visual sensitivities.
        mask: ``(B, T)``, 1 where a token counts.
        alpha_r, alpha_p, gamma_r, gamma_p, overlap, generator: as in ``tor_token_weights``.
        accelerator: see ``batch_top_fraction_mask``.

    Returns:
        ``(weights (B, T), metrics)`` with the keys of ``tor_token_weights``; with several
        processes the metrics describe this process's rows (the trainer averages them).
    """
    if overlap not in OVERLAP_MODES:
        raise ValueError(f"unknown overlap {overlap!r}; valid: {list(OVERLAP_MODES)}")
    if entropy.shape != sensitivity.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and sensitivity {tuple(sensitivity.shape)} differ"
        )
    valid = mask.bool()
    reasoning = batch_top_fraction_mask(entropy, valid, alpha_r, generator, accelerator)
    perception = batch_top_fraction_mask(sensitivity, valid, alpha_p, generator, accelerator)
    return tor_weights_from_selection(
        reasoning, perception, entropy, sensitivity, valid, gamma_r, gamma_p, overlap
    )


# ---------------------------------------------------------------- the token-weight strategy
def no_image_logprobs(policy: Any, batch: RolloutBatch, method: str) -> torch.Tensor:
    """(B, T) the completions' log-probs without the picture (``policy.no_image_logprobs``),
    or a TypeError naming ``method`` when the policy has no such pass."""
    if not hasattr(policy, "no_image_logprobs"):
        raise TypeError(
            f"{method} needs a policy with no_image_logprobs (e.g. VisionLanguagePolicy); "
            f"got {type(policy).__name__}"
        )
    return policy.no_image_logprobs(batch)


def tor_options(spec: Spec) -> dict[str, Any]:
    """The full option set of a ``tor*`` spec: paper defaults, then the preset, then the spec."""
    return _parsed(spec).model_dump(exclude={"name", "top_p"})


def _parsed(spec: Spec) -> TorOptions:
    return parse_options(spec, TorOptions, "token_weights", TOR_PRESETS[spec["name"]])


def validate_tor(spec: Spec, config: GRPOConfig) -> None:
    """Check a ``tor*`` token-weight spec before any model is built."""
    top_p = _parsed(spec).top_p
    # The entropy is computed during the rollout, from the same forward as old_logp, with the
    # config's entropy_top_p; a second top_p would silently be ignored.
    if top_p is not None and not math.isclose(top_p, config.entropy_top_p):
        raise ConfigError(
            f"token_weights.top_p ({top_p}) must equal entropy_top_p "
            f"({config.entropy_top_p}), the top-p the rollout's entropy uses; set both alike"
        )


def tor_weights(
    spec: Spec, batch: RolloutBatch, policy: Any, context: WeightContext
) -> tuple[torch.Tensor, Metrics]:
    """ToR token weights (docs/methods/tor.md) for a rollout batch. -> (B, T)

    Reasoning score: ``batch.entropy`` (top-p entropy from the rollout's forward). Perception
    score: ``|batch.old_logp - policy.no_image_logprobs(batch)|``. Both selections are over the
    whole rollout batch, across processes (``batch_tor_token_weights``).
    """
    if batch.entropy is None:
        raise ValueError("ToR needs the rollout's per-token entropy: sample with with_entropy=True")
    options = tor_options(spec)
    started = time.perf_counter()
    logp_without = no_image_logprobs(policy, batch, "ToR")  # (B, T)
    no_image_s = time.perf_counter() - started
    sensitivity = visual_sensitivity(batch.old_logp.detach(), logp_without)  # (B, T)
    weights, metrics = batch_tor_token_weights(
        batch.entropy,
        sensitivity,
        batch.completion_mask,
        alpha_r=float(options["alpha_r"]),
        alpha_p=float(options["alpha_p"]),
        gamma_r=float(options["gamma_r"]),
        gamma_p=float(options["gamma_p"]),
        overlap=options["overlap"],
        generator=context.generator,
        accelerator=context.accelerator,
    )
    metrics["time/no_image_pass_s"] = no_image_s
    # Everything ToR adds to a GRPO step: the no-image forward plus both selections.
    metrics["time/tor_weights_s"] = time.perf_counter() - started
    return weights, metrics


# ToR (docs/methods/tor.md) and its ablations "tor_reasoning_only" (gamma_p = 0) and
# "tor_perception_only" (gamma_r = 0), by name.
TOR_STRATEGIES: dict[str, TokenWeightStrategy] = {
    name: TokenWeightStrategy(
        tor_weights,
        validate_tor,
        needs_entropy=True,
        needs_rollout_logprobs=True,
        needs_image_pass=True,
    )
    for name in TOR_PRESETS
}
