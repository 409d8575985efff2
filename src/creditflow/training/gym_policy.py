"""The Credit Gym's tiny policy (docs/methods/credit_gym.md): a shared network over (family,
position, image) on top of a planted warm-start prior, sampled and scored through the
``rollout.Policy`` protocol so the shipped GRPO trainer and strategies run on it unchanged.

The prior is the warm start: it sets which positions are high-entropy forks and gives the
image channel a real (and a distracting) pull, so ToR's perception score has something to
find. The trainable part is one network shared by every position, so the credit a strategy
puts on free tokens moves the decisive ones too (a table per position would learn each
position alone, and no token weighting could matter).

Shape symbols: ``B`` completions, ``T`` content positions, ``L = T + 1`` completion tokens
(the closing tag included), ``V`` symbols, ``K`` image values, ``F`` families.
"""

from __future__ import annotations

import torch
from torch import nn

from creditflow.algorithms import topp_entropy
from creditflow.rollout.batch import RolloutBatch, SamplesOwnModule
from creditflow.tasks.credit_gym import CLOSE_TAG, GymWorld, symbols

# Logit of an impossible token (the tag off its position, symbols on it): finite, so every
# softmax and entropy stays finite, and far enough below to carry no mass in float32.
IMPOSSIBLE = -1e4


class GymTokenizer:
    """Symbols ``0 .. V-1`` decode to one letter each, id ``V`` to ``</translation>``."""

    def __init__(self, vocab_size: int):
        self.pieces = [*symbols(vocab_size), CLOSE_TAG]
        self.tag_id = vocab_size

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[int(i)] for i in ids)

    def content_ids(self, text: str) -> list[int]:
        """The content symbols of a decoded completion (the tag dropped)."""
        return [self.pieces.index(ch) for ch in text.replace(CLOSE_TAG, "")]


class GymNet(nn.Module):
    """logits (B, T, V) = prior[f, t] (+ image_prior[f, t, c] with the image) + net(f, t, c).

    net: ``out(tanh(E_f[f] + E_t[t] + E_c[c]))``, ``E_c`` only with the image; ``out`` starts
    at 0 so the policy starts exactly at the warm-start prior.
    """

    def __init__(self, prior: torch.Tensor, image_prior: torch.Tensor, hidden: int, seed: int):
        super().__init__()
        n_families, length, vocab = prior.shape
        n_images = image_prior.shape[2]
        gen = torch.Generator().manual_seed(seed)
        self.family = nn.Parameter(torch.randn(n_families, hidden, generator=gen))
        self.position = nn.Parameter(torch.randn(length, hidden, generator=gen))
        self.image = nn.Parameter(torch.randn(n_images, hidden, generator=gen))
        self.out = nn.Parameter(torch.zeros(hidden, vocab))
        self.register_buffer("prior", prior.float())  # (F, T, V)
        self.register_buffer("image_prior", image_prior.float())  # (F, T, K, V)

    def forward(
        self, family: torch.Tensor, image: torch.Tensor, with_image: bool = True
    ) -> torch.Tensor:
        """(B, T, V) content logits of prompts ``(family, image)``, each (B,)."""
        h = self.family[family][:, None, :] + self.position[None]  # (B, T, H)
        logits = self.prior[family]  # (B, T, V)
        if with_image:
            h = h + self.image[image][:, None, :]
            bump = self.image_prior[family]  # (B, T, K, V)
            index = image[:, None, None, None].expand(-1, bump.shape[1], 1, bump.shape[3])
            logits = logits + bump.gather(2, index).squeeze(2)
        return logits + torch.tanh(h) @ self.out


def warm_start_prior(
    world: GymWorld, seed: int, peak: float = 2.5, image_pull: float = 1.5, jitter: float = 0.3
) -> tuple[torch.Tensor, torch.Tensor]:
    """The planted warm start: ``(prior (F, T, V), image_prior (F, T, K, V))``.

    High-entropy positions are near-uniform (``jitter``); the others peak by ``peak`` on one
    token, a wrong one on a decisive position (so the fork must be found, as after a real
    warm start). A perception-dependent position pulls the right token by ``image_pull`` when
    the image is seen; as many free positions pull a token of their own per image (a
    distraction: image sensitivity alone does not find the decisive tokens).
    """
    gen = torch.Generator().manual_seed(seed + 7919)
    F, T, V, K = world.n_families, world.length, world.vocab_size, world.n_images
    prior = torch.randn(F, T, V, generator=gen) * jitter
    image_prior = torch.zeros(F, T, K, V)
    for f in range(F):
        for t in range(T):
            if world.high_entropy[f, t]:
                continue
            token = int(torch.randint(V, (1,), generator=gen))
            if world.decisive[f, t] and not world.perception[f, t]:
                token = (int(world.base[f, t]) + 1 + token % (V - 1)) % V  # never the right one
            prior[f, t, token] += peak
        n_pull = int(world.perception[f].sum())
        free = (~world.decisive[f]).nonzero().squeeze(1)
        distractors = free[torch.randperm(len(free), generator=gen)[:n_pull]]
        for k in range(K):
            right = (world.base[f] + k) % V  # (T,)
            pulled = world.perception[f].nonzero().squeeze(1)
            image_prior[f, pulled, k, right[pulled]] = image_pull
            noise = torch.randint(V, (len(distractors),), generator=gen)
            image_prior[f, distractors, k, noise] = image_pull
    return prior, image_prior


class GymPolicy(SamplesOwnModule):
    """The ``rollout.Policy`` of the gym. A prompt is a row ``(family, image)`` of ints; its
    ``prompt_ids`` are ``[family, image]``; the completion is ``T`` sampled symbols with the
    closing tag forced at ``tag_position``. ``no_image_logprobs`` scores a batch with the image
    channel masked (ToR's perception pass)."""

    def __init__(self, module: GymNet, tag_position: int, vocab_size: int, entropy_top_p: float):
        self.module = module
        self.tag_position = tag_position
        self.vocab_size = vocab_size
        self.entropy_top_p = entropy_top_p
        self.tokenizer = GymTokenizer(vocab_size)

    def completion_logits(
        self, batch_prompts: torch.Tensor, with_image: bool = True
    ) -> torch.Tensor:
        """(B, L, V + 1) logits of every completion token, the tag forced at its position."""
        content = self.module(batch_prompts[:, 0], batch_prompts[:, 1], with_image)  # (B, T, V)
        B, T, V = content.shape
        tag_col = torch.full((B, T, 1), IMPOSSIBLE)
        content = torch.cat([content, tag_col], dim=2)  # (B, T, V + 1)
        tag_row = torch.full((B, 1, V + 1), IMPOSSIBLE)
        tag_row[..., V] = 0.0
        p = self.tag_position
        return torch.cat([content[:, :p], tag_row, content[:, p:]], dim=1)  # (B, L, V + 1)

    def content_probs(self, batch_prompts: torch.Tensor) -> torch.Tensor:
        """(B, T, V) the sampling distribution at every content position (no grad)."""
        with torch.no_grad():
            return torch.softmax(self.module(batch_prompts[:, 0], batch_prompts[:, 1]), dim=-1)

    def sample(
        self,
        prompts: list,
        group_size: int,
        with_entropy: bool = False,
        with_logprobs: bool = True,
    ) -> RolloutBatch:
        rows = torch.tensor([list(p) for p in prompts], dtype=torch.long)  # (P, 2)
        rows = rows.repeat_interleave(group_size, dim=0)  # (B, 2)
        with torch.no_grad():
            logits = self.completion_logits(rows)  # (B, L, V + 1)
            ids = torch.distributions.Categorical(logits=logits).sample()  # (B, L)
        mask = torch.ones(ids.shape)
        batch = RolloutBatch(
            prompt_ids=rows,
            prompt_mask=torch.ones_like(rows),
            completion_ids=ids,
            completion_mask=mask,
            old_logp=torch.empty(0),
            completion_texts=[self.tokenizer.decode(r) for r in ids.tolist()],
            prompt_index=torch.zeros(len(rows), dtype=torch.long),
            group_size=group_size,
            truncated=torch.zeros(len(rows), dtype=torch.bool),
        )
        if with_logprobs or with_entropy:
            with torch.no_grad():
                logp, entropy = self.completion_logprobs(batch, with_entropy)
            batch.old_logp = logp if with_logprobs else torch.empty(0)
            batch.entropy = entropy
        return batch

    def completion_logprobs(
        self, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.completion_logits(batch.prompt_ids)  # (B, L, V + 1)
        logp = _sampled_logp(logits, batch.completion_ids)
        entropy = topp_entropy(logits.detach(), self.entropy_top_p) if with_entropy else None
        return logp, entropy

    def no_image_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """(B, L) log-probs of the sampled tokens with the image channel masked (no grad)."""
        with torch.no_grad():
            logits = self.completion_logits(batch.prompt_ids, with_image=False)
            return _sampled_logp(logits, batch.completion_ids)


def _sampled_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(B, L) log-probs of ``ids`` (B, L) under ``logits`` (B, L, V + 1)."""
    return torch.log_softmax(logits, dim=-1).gather(2, ids[..., None]).squeeze(2)
