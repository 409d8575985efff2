"""The token-level credit inspector: where a strategy puts the credit, token by token.

At the recorded steps of a run (``GRPOConfig.credit_inspector``; by default the first, a middle
and the last) ``CreditRecorder`` keeps, for the first ``rollouts`` completions of the rollout
batch, one row per valid completion token (``CREDIT_COLUMNS``, then ``reward/<name>`` for each
named reward of the completion). It observes only: nothing it does changes the update.

Where a value comes from:

- ``advantage`` / ``weight``: the (B, T) tensors the update receives (the weight after any
  importance-sampling correction); ``credit = advantage * weight``, the token's share of the
  policy-gradient signal.
- ``entropy``: the rollout's top-p entropy, where the token-weight strategy asked for it (NaN
  otherwise). ``image_logp_diff``: ``log pi(o_t | image) - log pi(o_t | no image)``, ToR's
  visual sensitivity before the absolute value, where the strategy scores the no-image pass (a
  policy with ``no_image_logprobs`` and rollout log-probs); it is recomputed for the recorded
  rows only, from the same weights, so it is ToR's value (NaN otherwise).
- ``ratio`` / ``clipped``: the importance ratio of the token in the loss and whether the clip
  (or CISPO's cap) was active, from the last update pass that held the completion (with one
  optimizer step per rollout batch the ratio is exactly 1 and nothing is clipped).
- ``segment``: ``translation`` through the token that completes ``</translation>``,
  ``reasoning`` after it; ``other`` in a completion without the closing tag (TAPO credits such a
  completion as all translation).
- ``deserved`` / ``prefix_value`` (only with ``credit_inspector.deserved``): the credit the
  token deserves, the change in expected reward across its span estimated from K continuations
  the policy samples from each span's start (``training.deserved_credit``), and the estimated
  value of the prefix that ends with the token where a span ends (NaN inside a span). Those
  continuations draw from their own seeded random stream, so the run's own draws (and so its
  training) are the same with the estimate on or off.

Shape symbols: ``B`` sequences, ``K`` recorded completions, ``T`` completion tokens.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

from creditflow.algorithms import IMPORTANCE_LEVELS, SURROGATES, SurrogateKnobs
from creditflow.config.grpo import CreditInspection, GRPOConfig
from creditflow.rewards import translation_segment_end
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.deserved_credit import (
    estimate_deserved_credit,
    prefix_sampler,
    reward_scorer,
    span_boundaries,
)
from creditflow.training.seeding import step_seed
from creditflow.training.strategies.tapo import REASONING, translation_segment_ids

CREDIT_COLUMNS = (
    "step",
    "prompt_id",
    "completion",
    "row",
    "position",
    "token_id",
    "token",
    "segment",
    "advantage",
    "weight",
    "credit",
    "entropy",
    "image_logp_diff",
    "selected",
    "ratio",
    "clipped",
)
SEGMENT_NAMES = ("translation", "reasoning", "other")
# The columns ``credit_inspector.deserved`` adds after CREDIT_COLUMNS.
DESERVED_COLUMNS = ("deserved", "prefix_value")
# The salt of the deserved-credit continuations' seed (training.seeding.step_seed): a stream
# of their own, apart from the rollout's and the token-weight strategies'.
DESERVED_SALT = 29


def token_texts(ids: list[int], tokenizer) -> list[str]:
    """The text each token adds to the decoding of ``ids`` (special tokens kept), so the pieces
    concatenate to the decoding. A byte-level token that ends inside a multi-byte character
    decodes to a replacement character; that character is held back and shows on the token
    that completes it (the piece of the first token is then empty)."""
    texts, emitted = [], ""
    for t in range(len(ids)):
        current = tokenizer.decode(ids[: t + 1], skip_special_tokens=False)
        stable = current if t == len(ids) - 1 else current.rstrip("\ufffd")
        if stable.startswith(emitted):
            texts.append(stable[len(emitted) :])
        else:  # a decoder that rewrites earlier text: the token's own decoding
            texts.append(tokenizer.decode(ids[t : t + 1], skip_special_tokens=False))
        emitted = stable
    return texts


def segment_labels(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, texts: list[str], tokenizer
) -> list[list[str]]:
    """Per row, the segment name of each valid token (``SEGMENT_NAMES``).

    completion_ids, completion_mask: (K, T); texts: the K decoded completions.
    """
    ids = translation_segment_ids(completion_ids, completion_mask, texts, tokenizer)  # (K, T)
    labels = []
    for row, text in enumerate(texts):
        n_valid = int(completion_mask[row].sum())
        if translation_segment_end(text) is None:
            labels.append(["other"] * n_valid)
        else:
            row_ids = ids[row, :n_valid].tolist()
            labels.append(["reasoning" if i == REASONING else "translation" for i in row_ids])
    return labels


class CreditRecorder:
    """Records the credit of the first ``inspection.rollouts`` completions at the recorded
    steps. The trainer calls ``begin`` before the update of a step it records (``records``),
    ``observe`` from every loss forward, and ``finish`` after the update for the rows.
    ``reward_fn``: the run's reward function, which the deserved credit scores its sampled
    continuations with (needed only with ``inspection.deserved``)."""

    def __init__(
        self,
        inspection: CreditInspection,
        config: GRPOConfig,
        scores_image: bool,
        reward_fn: Any = None,
    ):
        if inspection.deserved is not None and reward_fn is None:
            raise ValueError("credit_inspector.deserved scores continuations: pass reward_fn")
        self.inspection = inspection
        self.config = config
        self.steps = inspection.recorded_steps(config.steps)
        self.scores_image = scores_image  # the strategy runs the no-image pass (ToR)
        self.reward_fn = reward_fn
        self._active: dict[str, Any] | None = None

    def records(self, step: int) -> bool:
        """Whether 0-based ``step`` is recorded."""
        return step + 1 in self.steps

    def begin(
        self,
        step: int,
        batch: RolloutBatch,
        rewards: dict[str, torch.Tensor],
        advantages: torch.Tensor,
        weights: torch.Tensor,
        policy: Any,
    ) -> None:
        """Keep the recorded rows' tensors (rewards: name -> (B,); advantages, weights:
        (B, T)) until ``finish``."""
        if getattr(policy, "tokenizer", None) is None:
            raise TypeError(
                f"credit_inspector reads token texts through the policy's tokenizer; a "
                f"{type(policy).__name__} has none: set credit_inspector to null"
            )
        rows = torch.arange(min(self.inspection.rollouts, batch.batch_size))  # (K,)
        sub = batch.select(rows)
        image_diff = None
        if self.scores_image and hasattr(policy, "no_image_logprobs") and sub.old_logp.numel():
            with torch.no_grad():
                image_diff = (sub.old_logp - policy.no_image_logprobs(sub)).float().cpu()
        self._active = {
            "step": step + 1,
            "batch": sub,
            "ids": sub.completion_ids.cpu(),  # (K, T): how observe recognises the rows
            "prompts": sub.prompt_index.cpu(),  # (K,)
            "rewards": {name: values[rows].float().cpu() for name, values in rewards.items()},
            "advantages": advantages[rows].detach().float().cpu(),  # (K, T)
            "weights": weights[rows].detach().float().cpu(),  # (K, T)
            "image_diff": image_diff,  # (K, T) or None
            "ratio": torch.ones(len(rows), batch.completion_ids.shape[1]),  # (K, T)
            "clipped": torch.zeros(len(rows), batch.completion_ids.shape[1], dtype=torch.bool),
            "tokenizer": policy.tokenizer,
            "deserved": self._deserved(step, sub, rewards, rows, policy),
        }

    def _deserved(
        self,
        step: int,
        sub: RolloutBatch,
        rewards: dict[str, torch.Tensor],
        rows: torch.Tensor,
        policy: Any,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The recorded rows' (K, T) deserved credit and (K, T + 1) prefix values, or None
        when the estimate is off. Sampled before the update, from the policy that drew them."""
        spec = self.inspection.deserved
        if spec is None:
            return None
        mask = sub.completion_mask
        segment_ids = None
        if spec.every == "segments":
            segment_ids = translation_segment_ids(
                sub.completion_ids.cpu(), mask.cpu(), sub.completion_texts, policy.tokenizer
            )
        boundaries = span_boundaries(spec.every, mask.cpu(), segment_ids)
        final = sum(
            w * rewards[name][rows].float().cpu() for name, w in self.config.rewards.items()
        )
        device = getattr(policy, "device", torch.device("cpu"))
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(step_seed(self.config.seed, step, DESERVED_SALT))
            return estimate_deserved_credit(
                prefix_sampler(policy, sub),
                reward_scorer(self.reward_fn, self.config.rewards, sub, policy.tokenizer),
                boundaries,
                mask.cpu(),
                final,
                spec.continuations,
            )

    def observe(
        self,
        batch: RolloutBatch,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
    ) -> None:
        """One loss forward's ratios (logp, old_logp, advantages: (b, T) of ``batch``, a
        selection of the step's rows), kept for every recorded completion ``batch`` holds. A
        row is recognised by its prompt and completion tokens; identical completions of one
        prompt have identical ratios."""
        if self._active is None:
            return
        ids, prompts = self._active["ids"], self._active["prompts"]
        same = (batch.completion_ids[None].cpu() == ids[:, None]).all(-1)
        same &= batch.prompt_index[None].cpu() == prompts[:, None]  # (K, b)
        if not same.any():
            return
        c = self.config
        options = c.loss_options()
        valid = batch.completion_mask.bool()
        log_ratio = IMPORTANCE_LEVELS[c.importance_level]((logp - old_logp).detach(), valid)
        ratio = log_ratio.exp()  # (b, T)
        if advantages.dim() == 1:
            advantages = advantages[:, None].expand_as(ratio)
        knobs = SurrogateKnobs(
            **{f.name: options[f.name] for f in fields(SurrogateKnobs) if f.name in options}
        )  # what the loss reads; a knob the surrogate does not read keeps its default
        _, clip_active = SURROGATES[c.surrogate](ratio, advantages, logp.detach(), knobs)  # (b, T)
        for k, j in same.nonzero().tolist():
            self._active["ratio"][k] = ratio[j].float().cpu()
            self._active["clipped"][k] = clip_active[j].cpu()

    def finish(self) -> list[dict[str, Any]]:
        """The recorded step's rows, one per valid completion token (``CREDIT_COLUMNS``, then
        ``reward/<name>``)."""
        active, self._active = self._active, None
        if active is None:
            return []
        batch, tokenizer = active["batch"], active["tokenizer"]
        mask = batch.completion_mask.cpu()
        segments = segment_labels(
            batch.completion_ids.cpu(), mask, batch.completion_texts, tokenizer
        )
        entropy = None if batch.entropy is None else batch.entropy.float().cpu()
        nan = float("nan")
        deserved = active["deserved"]  # None, or (K, T) credit and (K, T + 1) values
        rows = []
        for k in range(batch.batch_size):
            n_valid = int(mask[k].sum())
            ids = batch.completion_ids[k, :n_valid].tolist()
            texts = token_texts(ids, tokenizer)
            rewards = {f"reward/{name}": float(v[k]) for name, v in active["rewards"].items()}
            for t in range(n_valid):
                advantage = float(active["advantages"][k, t])
                weight = float(active["weights"][k, t])
                rows.append(
                    {
                        "step": active["step"],
                        "prompt_id": int(batch.prompt_index[k]),
                        "completion": k % batch.group_size,
                        "row": k,
                        "position": t,
                        "token_id": ids[t],
                        "token": texts[t],
                        "segment": segments[k][t],
                        "advantage": advantage,
                        "weight": weight,
                        "credit": advantage * weight,
                        "entropy": nan if entropy is None else float(entropy[k, t]),
                        "image_logp_diff": nan
                        if active["image_diff"] is None
                        else float(active["image_diff"][k, t]),
                        "selected": weight > 0,
                        "ratio": float(active["ratio"][k, t]),
                        "clipped": bool(active["clipped"][k, t]),
                        **rewards,
                    }
                )
                if deserved is not None:
                    rows[-1]["deserved"] = float(deserved[0][k, t])
                    rows[-1]["prefix_value"] = float(deserved[1][k, t + 1])
        return rows


def credit_recorder(
    config: GRPOConfig, token_weights: Any, reward_fn: Any = None
) -> CreditRecorder | None:
    """The run's recorder, None when ``config.credit_inspector`` is off. ``token_weights``: the
    run's ``TokenWeightStrategy`` (whether it scores the no-image pass); ``reward_fn``: the
    run's reward function (the deserved credit's scorer)."""
    inspection = config.credit_inspection()
    if inspection is None:
        return None
    return CreditRecorder(
        inspection, config, scores_image=token_weights.needs_rollout_logprobs, reward_fn=reward_fn
    )
