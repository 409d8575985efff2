"""A GRPO policy around the generative reranker (docs/methods/experience.md, step 5).

Shape symbols: ``N`` sessions the policy holds, ``B`` sampled pages (= prompts x G), ``L``
candidates per page, ``F`` candidate features. A "prompt" is a session index (row of the
``features`` tensor the policy holds); a "completion" is a ranking of that session's
candidates, one "token" per position. Rankings follow ``chain.reranker.model``: a permutation of
``0..L-1`` with the real candidates first, so ``completion_mask`` (1 on the steps that place a
real candidate) equals the candidate mask whenever padding slots come last.

The engine hands its reward function only ``(completion_texts, prompt_index)``; the texts are
therefore the rankings themselves, space-joined candidate indices (``format_ranking``), which
``parse_rankings`` reads back exactly. That keeps the reward a pure function of what the engine
passes and makes the engine's logged sample completions readable rankings.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from creditflow.chain.reranker.model import PointerReranker, pointer_entropy, step_mask
from creditflow.rollout.batch import RolloutBatch, SamplesOwnModule


def format_ranking(ranking: Sequence[int] | torch.Tensor) -> str:
    """The completion text of one ranking: its candidate indices, space-joined.

    >>> format_ranking(torch.tensor([2, 0, 1]))
    '2 0 1'
    """
    values = ranking.tolist() if isinstance(ranking, torch.Tensor) else list(ranking)
    return " ".join(str(int(v)) for v in values)


def parse_rankings(texts: Sequence[str], length: int) -> torch.Tensor:
    """``(B, L)`` long rankings read back from ``format_ranking`` texts.

    Raises:
        ValueError: a text is not ``length`` integers forming a permutation of ``0..length-1``.

    >>> parse_rankings(["2 0 1", "0 1 2"], 3)
    tensor([[2, 0, 1],
            [0, 1, 2]])
    """
    rows = []
    for i, text in enumerate(texts):
        try:
            row = [int(token) for token in text.split()]
        except ValueError:
            raise ValueError(f"completion {i} is not space-separated integers: {text!r}") from None
        if sorted(row) != list(range(length)):
            raise ValueError(f"completion {i} is not a permutation of 0..{length - 1}: {text!r}")
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long).view(len(rows), length)


class RerankerPolicy(SamplesOwnModule):
    """Samples and scores rankings of a :class:`PointerReranker` (satisfies ``rollout.Policy``).

    Args:
        model: the reranker; ``module`` of the policy.
        features: ``(N, L, F)`` float candidate features of every session (``prompts`` index
            its rows).
        mask: ``(N, L)`` bool, True on real candidates.
        temperature: divides the pointer scores when sampling and when log-probs are
            recomputed, so old and new log-probs describe the distribution sampled from; above 1
            keeps exploring after a sharp (e.g. y_aug) pre-training.
    """

    def __init__(
        self,
        model: PointerReranker,
        features: torch.Tensor,
        mask: torch.Tensor,
        temperature: float = 1.0,
    ):
        if features.dim() != 3 or mask.shape != features.shape[:2]:
            raise ValueError(
                f"need features (N, L, F) and mask (N, L), got {tuple(features.shape)} "
                f"and {tuple(mask.shape)}"
            )
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.module = model
        self.temperature = temperature
        self.features = features
        self.mask = mask.bool()

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def sample(
        self,
        prompts: Sequence[int],
        group_size: int,
        with_entropy: bool = False,
        with_logprobs: bool = True,
    ) -> RolloutBatch:
        """Draw ``group_size`` rankings per session index in ``prompts``; rows of one session are
        consecutive. Uses the global RNG, which the engine seeds per step."""
        sessions = torch.as_tensor(list(prompts), dtype=torch.long)  # (P,)
        if sessions.numel() and (sessions.min() < 0 or sessions.max() >= len(self.features)):
            raise ValueError(
                f"prompts must be session indices in 0..{len(self.features) - 1}, got {sessions.tolist()}"
            )
        rows = sessions.repeat_interleave(group_size)  # (B,)
        features = self.features[rows].to(self.device)  # (B, L, F)
        mask = self.mask[rows].to(self.device)  # (B, L)
        was_training = self.module.training
        self.module.eval()
        try:
            rankings, old_logp = self.module.sample(
                features, mask, temperature=self.temperature
            )  # (B, L), (B, L)
            entropy = None
            if with_entropy:
                with torch.no_grad():
                    log_probs = self.module(features, mask, rankings, self.temperature)
                entropy = pointer_entropy(log_probs)  # (B, L)
        finally:
            self.module.train(was_training)
        return RolloutBatch(
            # The session index is the whole "prompt": one token per row.
            prompt_ids=rows.unsqueeze(1).to(self.device),  # (B, 1)
            prompt_mask=torch.ones(len(rows), 1, dtype=torch.long, device=self.device),
            completion_ids=rankings,
            completion_mask=step_mask(mask).float(),  # (B, L)
            old_logp=old_logp,
            completion_texts=[format_ranking(r) for r in rankings.cpu()],
            prompt_index=torch.arange(len(sessions)).repeat_interleave(group_size),
            group_size=group_size,
            entropy=entropy,
            # Row-aligned, so RolloutBatch.select slices them with the minibatch.
            extras={"features": features, "candidate_mask": mask},
        )

    def completion_logprobs(
        self, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(B, L)`` teacher-forced log-probs of the rankings in ``batch`` (with grad when
        enabled; 0 at padding steps) and on request the ``(B, L)`` entropy of each step's
        pointer distribution (no grad)."""
        log_probs = self.module(
            batch.extras["features"],
            batch.extras["candidate_mask"],
            batch.completion_ids,
            self.temperature,
        )  # (B, L, L)
        logp = log_probs.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, L)
        entropy = pointer_entropy(log_probs.detach()) if with_entropy else None
        return logp, entropy


@torch.no_grad()
def greedy_rankings(
    model: PointerReranker, features: torch.Tensor, mask: torch.Tensor, batch_size: int = 512
) -> torch.Tensor:
    """``(N, L)`` arg-max rankings of ``model`` (the page it would serve) for ``features``
    ``(N, L, F)`` and ``mask`` ``(N, L)``, in batches of ``batch_size`` sessions; leaves the
    model in eval mode."""
    model.eval()
    parts = [
        model.sample(features[i : i + batch_size], mask[i : i + batch_size], greedy=True)[0]
        for i in range(0, len(features), batch_size)
    ]
    return torch.cat(parts) if parts else torch.zeros(mask.shape, dtype=torch.long)
