"""The generative reranker: a pointer network that emits a page one candidate at a time
(docs/methods/experience.md, steps 4-5).

Shape symbols: ``N`` pages (sessions, or ``B`` sampled rows), ``L`` candidates per page,
``F`` candidate features, ``D`` model width. ``mask`` is 1 / True on real candidates and 0 on
padding. A ranking ("permutation") maps position -> candidate index and is always a
permutation of ``0..L-1``: a page's real candidates fill its first ``n`` positions, where ``n``
is its number of real candidates, and its padding slots follow in index order, each placed with
probability 1 (log-prob 0). Only the first ``n`` steps of a page count (``step_mask``).

Architecture: candidate features -> linear embedding -> Transformer encoder over the page (no
positional encoding: the candidate set is unordered; the logged position, when wanted, is a
feature) -> a GRU decoder whose state starts from the masked mean of the encodings and reads the
encoding of each chosen candidate. At step ``t`` the state's query scores every candidate by a
scaled dot product with its encoding (pointer attention); chosen candidates and padding are
masked with ``-inf``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import nn

from creditflow.chain.config import RerankerConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_TYPE = "pointer_reranker"


def _choosable(mask: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """``(N, L)`` bool: the candidates the next step may pick.

    The unchosen real candidates while a page has any; afterwards only its first unchosen
    (padding) slot, so the remaining steps are forced and every row stays a permutation.
    """
    available = mask & ~chosen
    first_unchosen = F.one_hot((~chosen).to(torch.uint8).argmax(dim=1), mask.shape[1]).bool()
    page_done = ~available.any(dim=1, keepdim=True)  # (N, 1)
    return torch.where(page_done, first_unchosen, available)


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def step_mask(mask: torch.Tensor) -> torch.Tensor:
    """``(N, L)`` bool: True at the steps that place a real candidate (the first ``n`` of a
    page with ``n`` real candidates); the later steps place padding and do not count.

    >>> step_mask(torch.tensor([[True, False, True]]))
    tensor([[ True,  True, False]])
    """
    n_real = mask.sum(dim=1, keepdim=True)  # (N, 1)
    return torch.arange(mask.shape[1], device=mask.device) < n_real


def pointer_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """``(N, L)`` entropy (nats) of each step's pointer distribution.

    log_probs: ``(N, L, L)`` step log-probs, ``-inf`` on candidates a step cannot pick. Forced
    steps (one choosable candidate) have entropy 0.

    >>> pointer_entropy(torch.tensor([[[0.5, 0.5], [1.0, 0.0]]]).log())
    tensor([[0.6931, 0.0000]])
    """
    probs = log_probs.exp()
    # where(): 0 * -inf is NaN; an impossible candidate contributes nothing.
    terms = torch.where(probs > 0, probs * log_probs, torch.zeros_like(log_probs))
    return 0.0 - terms.sum(dim=-1)  # 0 - x, not -x: a forced step gives 0, not -0


class PointerReranker(nn.Module):
    """Autoregressive listwise reranker: ``p(y | page) = prod_t p(y_t | y_<t, page)``.

    Args:
        config: the architecture.
    """

    def __init__(self, config: RerankerConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed = nn.Linear(config.n_features, d)
        layer = nn.TransformerEncoderLayer(
            d,
            config.n_heads,
            dim_feedforward=config.dim_feedforward,
            dropout=config.dropout,
            batch_first=True,
        )
        # Nested tensors would drop the padded positions and change the numerics between eval
        # and train mode; pages are short, so dense attention costs nothing.
        self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.init_state = nn.Linear(d, d)
        self.cell = nn.GRUCell(d, d)
        self.query = nn.Linear(d, d)

    # ------------------------------------------------------------------ pieces
    def _check_inputs(self, features: torch.Tensor, mask: torch.Tensor) -> None:
        if features.dim() != 3 or features.shape[-1] != self.config.n_features:
            raise ValueError(
                f"features must have shape (N, L, F={self.config.n_features}), "
                f"got {tuple(features.shape)}"
            )
        if mask.shape != features.shape[:2]:
            raise ValueError(
                f"mask must have shape (N, L) = {tuple(features.shape[:2])}, got {tuple(mask.shape)}"
            )

    def encode(
        self, features: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidate encodings ``(N, L, D)`` and the initial decoder state ``(N, D)``.

        features: ``(N, L, F)`` float; mask: ``(N, L)`` bool, True on real candidates.
        """
        self._check_inputs(features, mask)
        mask = mask.bool()
        # A page without any real candidate would attend to nothing (NaN); let it attend to
        # everything instead: none of its steps counts.
        ignore = ~mask & mask.any(dim=1, keepdim=True)  # (N, L) True = not attended to
        encodings = self.encoder(self.embed(features), src_key_padding_mask=ignore)  # (N, L, D)
        weights = mask.unsqueeze(-1).to(encodings.dtype)  # (N, L, 1)
        # clamp: an all-padding page pools to 0 instead of 0 / 0.
        pooled = (encodings * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)  # (N, D)
        return encodings, torch.tanh(self.init_state(pooled))

    def _step_log_probs(
        self,
        encodings: torch.Tensor,
        state: torch.Tensor,
        choosable: torch.Tensor,
        temperature: float,
    ) -> torch.Tensor:
        """``(N, L)`` log-probs of picking each candidate next; ``-inf`` where not choosable."""
        query = self.query(state)  # (N, D)
        scale = math.sqrt(self.config.d_model) * temperature
        scores = torch.einsum("nld,nd->nl", encodings, query) / scale
        return scores.masked_fill(~choosable, float("-inf")).log_softmax(dim=-1)  # (N, L)

    def _advance(
        self, encodings: torch.Tensor, state: torch.Tensor, picked: torch.Tensor
    ) -> torch.Tensor:
        """The decoder state after reading the encoding of each row's ``picked`` (N,) candidate."""
        rows = torch.arange(encodings.shape[0], device=encodings.device)
        return self.cell(encodings[rows, picked], state)  # (N, D)

    # ------------------------------------------------------------------ teacher forcing
    def forward(
        self,
        features: torch.Tensor,
        mask: torch.Tensor,
        permutations: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Teacher-forced ``(N, L, L)`` step log-probs (see :meth:`step_log_probs`); the forward
        pass, so a DDP wrapper around the model computes (and all-reduces) exactly this."""
        return self.step_log_probs(features, mask, permutations, temperature)

    def step_log_probs(
        self,
        features: torch.Tensor,
        mask: torch.Tensor,
        permutations: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Teacher-forced ``(N, L, L)`` log-probs: entry ``[n, t, i]`` is
        ``log p(y_t = i | y_<t = permutations[n, :t])``, ``-inf`` for candidates step ``t``
        cannot pick.

        Args:
            features: ``(N, L, F)`` float candidate features.
            mask: ``(N, L)`` bool, True on real candidates.
            permutations: ``(N, L)`` long rankings (position -> candidate), real candidates
                first and padding slots after them in index order (see the module docstring).
            temperature: divides the pointer scores (> 0); use the one the rankings were
                sampled with.

        Raises:
            ValueError: a ranking repeats a candidate, leaves the range, or places padding
                before a real candidate.
        """
        if permutations.shape != mask.shape:
            raise ValueError(
                f"permutations must have shape (N, L) = {tuple(mask.shape)}, "
                f"got {tuple(permutations.shape)}"
            )
        _check_temperature(temperature)
        L = mask.shape[1]
        if permutations.numel() and (permutations.min() < 0 or permutations.max() >= L):
            raise ValueError(f"permutations must hold candidate indices in 0..{L - 1}")
        mask = mask.bool()
        permutations = permutations.long()
        if L == 0:
            self._check_inputs(features, mask)
            return torch.zeros(mask.shape[0], 0, 0, device=mask.device)
        encodings, state = self.encode(features, mask)
        chosen = torch.zeros_like(mask)
        steps = []
        for t in range(L):
            choosable = _choosable(mask, chosen)
            step = self._step_log_probs(encodings, state, choosable, temperature)  # (N, L)
            steps.append(step)
            picked = permutations[:, t]  # (N,)
            chosen = chosen | F.one_hot(picked, L).bool()
            state = self._advance(encodings, state, picked)
        log_probs = torch.stack(steps, dim=1)  # (N, L, L)
        taken = log_probs.gather(-1, permutations.unsqueeze(-1)).squeeze(-1)  # (N, L)
        if torch.isneginf(taken).any():
            bad = torch.isneginf(taken).any(dim=1).nonzero().flatten()[:5].tolist()
            raise ValueError(
                f"rows {bad} of permutations are not valid rankings: each must be a permutation "
                "of 0..L-1 with the real candidates first and padding slots after them in index order"
            )
        return log_probs

    def log_probs_of(
        self,
        features: torch.Tensor,
        mask: torch.Tensor,
        permutations: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """``(N, L)`` teacher-forced log-prob of each step's choice ``permutations[:, t]`` given
        the prefix; 0 at padding steps (they are forced). Arguments as in
        :meth:`step_log_probs`."""
        log_probs = self.step_log_probs(features, mask, permutations, temperature)  # (N, L, L)
        return log_probs.gather(-1, permutations.long().unsqueeze(-1)).squeeze(-1)  # (N, L)

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample(
        self,
        features: torch.Tensor,
        mask: torch.Tensor,
        generator: torch.Generator | None = None,
        greedy: bool = False,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw one ranking per page (or take the most likely choice at every step).

        Args:
            features: ``(N, L, F)`` float candidate features.
            mask: ``(N, L)`` bool, True on real candidates.
            generator: source of randomness (the global one when None).
            greedy: pick the arg-max candidate at each step instead of sampling.
            temperature: divides the pointer scores (> 0); above 1 explores more.

        Returns:
            ``(permutations (N, L) long, logp (N, L) float)``: rankings laid out as in the
            module docstring, and each step's log-prob (0 at the forced padding steps).
        """
        _check_temperature(temperature)
        mask = mask.bool()
        N, L = mask.shape
        if N == 0 or L == 0:
            self._check_inputs(features, mask)
            return torch.zeros(N, L, dtype=torch.long), torch.zeros(N, L)
        encodings, state = self.encode(features, mask)
        chosen = torch.zeros_like(mask)
        picks, logps = [], []
        for _ in range(L):
            choosable = _choosable(mask, chosen)
            step = self._step_log_probs(encodings, state, choosable, temperature)  # (N, L)
            if greedy:
                picked = step.argmax(dim=-1)  # (N,)
            else:
                # Probabilities of unchoosable candidates are exactly 0: never drawn.
                picked = torch.multinomial(step.exp(), 1, generator=generator).squeeze(-1)
            picks.append(picked)
            logps.append(step.gather(-1, picked.unsqueeze(-1)).squeeze(-1))
            chosen = chosen | F.one_hot(picked, L).bool()
            state = self._advance(encodings, state, picked)
        return torch.stack(picks, dim=1), torch.stack(logps, dim=1)

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (created)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {"model_type": MODEL_TYPE, **asdict(self.config)}
        (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        save_model(self, str(directory / WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str = "cpu") -> PointerReranker:
        """Load a reranker written by :meth:`save_pretrained`, in eval mode."""
        directory = Path(directory)
        values = json.loads((directory / CONFIG_NAME).read_text())
        model_type = values.pop("model_type", None)
        if model_type != MODEL_TYPE:
            raise ValueError(
                f"{directory / CONFIG_NAME} describes model_type {model_type!r}, not {MODEL_TYPE!r}"
            )
        model = cls(RerankerConfig.from_dict(values))
        load_model(model, str(directory / WEIGHTS_NAME), device=device)
        return model.to(device).eval()


def build_reranker(n_features: int, architecture: Mapping[str, Any], seed: int) -> PointerReranker:
    """A freshly initialised reranker reading ``n_features`` features, with the
    ``RerankerConfig`` fields in ``architecture``; its weights depend only on ``seed`` (the
    global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PointerReranker(RerankerConfig.from_dict({"n_features": n_features, **architecture}))
