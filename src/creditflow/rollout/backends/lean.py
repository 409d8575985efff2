"""The ``lean`` rollout backend: a hand-written decode loop for Qwen2 and Llama text models.

It samples from the trained ``Qwen2ForCausalLM`` or ``LlamaForCausalLM`` itself (Qwen2 /
Qwen2.5, SmolLM2 and Llama checkpoints, the tiny test models), a LoRA policy's with its
adapters applied, with what ``model.generate`` spends per step taken out of the loop:

- fused weights (``lean_weights``): one ``(Hq*D + 2*Hkv*D, H)`` QKV projection and one
  ``(2*I, H)`` gate/up projection per layer, LoRA adapters merged in, built from the module's
  parameters once per ``weights_version`` (the policy bumps it after every optimizer step),
  not once per call;
- a static KV cache for all ``P + T`` positions, allocated once per call;
- the prompt prefilled once per group (N rows, not B = N * G) and its KV copied to the G rows;
- sampling on the ``(B, V)`` float32 logits with the exact semantics of ``HFBackend``:
  suppressed ids, then temperature, top-k and top-p (the same ops as transformers'
  ``SuppressTokensLogitsProcessor``, ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and
  ``TopPLogitsWarper`` with ``min_tokens_to_keep=1``), one ``torch.multinomial`` call on the
  ``(B, V)`` probabilities per step (as ``generate`` makes), argmax when greedy; a finished row
  emits ``pad_id`` and the loop ends when every row has finished or T steps are done.

Because the call order of the random stream is ``generate``'s and the logits agree to float
tolerance, a seeded ``lean`` rollout draws the same tokens as a seeded ``hf`` one, except where
a float difference flips a sample.

Shape symbols: N prompts, G completions per prompt, B = N * G rows, P prompt tokens
(left-padded), T new tokens, S = P + T cache slots, H hidden size, Hq / Hkv query / key-value
heads, D head size, I MLP size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from transformers import Qwen2_5_VLForConditionalGeneration

from creditflow.algorithms.logprobs import CHUNK_LOGITS
from creditflow.algorithms.tor import topp_entropy
from creditflow.rollout.backends.base import Generation, GenerationRequest, finish_reasons
from creditflow.rollout.backends.lean_weights import (
    FusedWeights,
    LayerWeights,
    fuse_weights,
    matmul_dtype,
    model_reason,
)
from creditflow.rollout.modules import base_model


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``Qwen2RMSNorm``: normalised in float32, scaled in the input's dtype."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (..., D); cos, sin broadcast to it."""
    return x * cos + rotate_half(x) * sin


def fold_query_groups(q: torch.Tensor, mask: torch.Tensor, num_kv_heads: int):
    """GQA without repeating the KV heads: the ``rep = Hq / Hkv`` query heads of a KV head are
    folded into its query rows (query head ``g * rep + r`` reads KV head ``g``, as
    ``repeat_kv`` pairs them).

    q: (R, Hq, L, D) -> (R, Hkv, rep * L, D); mask: (R, 1, L, S) -> (R, 1, rep * L, S).
    """
    R, Hq, L, D = q.shape
    rep = Hq // num_kv_heads
    q = q.reshape(R, num_kv_heads, rep * L, D)
    if rep > 1 and L > 1:  # with one query row the (R, 1, 1, S) mask broadcasts as it is
        S = mask.shape[-1]
        mask = mask.unsqueeze(2).expand(R, 1, rep, L, S).reshape(R, 1, rep * L, S)
    return q, mask


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, as transformers' "sdpa" attention computes it.

    q: (R, Hq, L, D); k, v: (R, Hkv, S, D); allowed: (R, 1, L, S) bool, True = attend.
    Returns (R, L, Hq * D), the layout ``o_proj`` reads.
    """
    R, Hq, L, D = q.shape
    q, allowed = fold_query_groups(q, allowed, k.shape[1])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    return out.view(R, Hq, L, D).transpose(1, 2).reshape(R, L, Hq * D)


def eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """transformers' ``eager_attention_forward``: matmul, scale, mask, float32 softmax cast
    back to the query's dtype, matmul (so an ambient autocast casts the same ops). Shapes as
    ``sdpa_attention``."""
    R, Hq, L, D = q.shape
    q, allowed = fold_query_groups(q, allowed, k.shape[1])
    weights = torch.matmul(q, k.transpose(2, 3)) * scale
    weights = weights.masked_fill(~allowed, -float("inf"))
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights, v)
    return out.view(R, Hq, L, D).transpose(1, 2).reshape(R, L, Hq * D)


# The module's ``config._attn_implementation`` -> the attention the loop runs; every other
# implementation (flash, flex) computes the same softmax attention as "sdpa".
ATTENTIONS = {"eager": eager_attention, "sdpa": sdpa_attention}


class LeanDecoder:
    """One call's decode state: the static KV cache, the RoPE table and the key mask.

    ``prefill`` runs the N prompts once and returns the ``(B, V)`` float32 logits of the first
    new token (each prompt's row repeated G times); each ``step`` feeds the B tokens chosen
    last and returns the next ``(B, V)`` logits. At most ``max_new_tokens - 1`` steps.

    Positions count real tokens only (``cumsum(mask) - 1``, as ``generate`` does for
    left-padded prompts); a padded key is never attended, a padded query attends to itself
    only (its output is never read; a row with no key at all would be NaN and spread through
    the values of later layers).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        weights: FusedWeights,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group_size: int,
        max_new_tokens: int,
    ):
        self.weights = weights
        self.prompt_ids = prompt_ids  # (N, P)
        self.prompt_mask = prompt_mask.bool()  # (N, P)
        self.G = group_size
        N, self.P = prompt_ids.shape
        self.B = N * group_size
        self.S = self.P + max_new_tokens
        self.scale = weights.head_dim**-0.5
        self.attention = ATTENTIONS.get(model.config._attn_implementation, sdpa_attention)
        device = prompt_ids.device
        # cos/sin of every position a row can reach, from the model's own rotary module (so any
        # static RoPE scaling is the model's); (S, D) in the dtype its forward gives.
        positions = torch.arange(self.S, device=device).unsqueeze(0)
        probe = weights.embed[:1].unsqueeze(0)  # (1, 1, H): only its dtype and device are read
        cos, sin = model.model.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0], sin[0]  # (S, D)
        # Keys a row may attend: its real prompt tokens, then every generated slot.
        self.key_ok = torch.ones(self.B, self.S, dtype=torch.bool, device=device)  # (B, S)
        self.key_ok[:, : self.P] = self.prompt_mask.repeat_interleave(group_size, dim=0)
        lengths = self.prompt_mask.sum(dim=1).repeat_interleave(group_size)  # (B,)
        self.next_position = lengths  # (B,) position of the token the next step feeds
        self.cache_k: list[torch.Tensor] = []  # L of (B, Hkv, S, D)
        self.cache_v: list[torch.Tensor] = []
        self.length = 0  # cache slots filled

    def _project_qkv(
        self, layer: LayerWeights, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: (R, L, H) -> q (R, L, Hq, D), k and v (R, L, Hkv, D)."""
        w = self.weights
        D = w.head_dim
        qkv = F.linear(h, layer.qkv_weight, layer.qkv_bias)
        q, k, v = qkv.split([w.num_heads * D, w.num_kv_heads * D, w.num_kv_heads * D], dim=-1)
        R, L = h.shape[:2]
        return q.view(R, L, -1, D), k.view(R, L, -1, D), v.view(R, L, -1, D)

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, layer.post_attention_norm, self.weights.eps)
        gate, up = F.linear(h, layer.gate_up_weight, layer.gate_up_bias).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer.down_weight, layer.down_bias)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: (R, H) last hidden states -> (R, V) float32 logits."""
        h = rms_norm(x, self.weights.norm, self.weights.eps)
        return F.linear(h, self.weights.head).to(torch.float32)

    def prefill(self) -> torch.Tensor:
        """The prompts' KV into the cache; returns the first token's (B, V) logits."""
        w, G, P = self.weights, self.G, self.P
        mask = self.prompt_mask
        positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (N, P)
        cos = self.cos[positions].unsqueeze(1)  # (N, 1, P, D)
        sin = self.sin[positions].unsqueeze(1)
        causal = torch.ones(P, P, dtype=torch.bool, device=mask.device).tril()
        allowed = causal & mask[:, None, :]  # (N, P, P)
        allowed |= torch.eye(P, dtype=torch.bool, device=mask.device)
        allowed = allowed.unsqueeze(1)  # (N, 1, P, P)
        x = F.embedding(self.prompt_ids, w.embed)  # (N, P, H)
        for layer in w.layers:
            h = rms_norm(x, layer.input_norm, w.eps)
            q, k, v = self._project_qkv(layer, h)
            q = apply_rope(q.transpose(1, 2), cos, sin)  # (N, Hq, P, D)
            k = apply_rope(k.transpose(1, 2), cos, sin)  # (N, Hkv, P, D)
            v = v.transpose(1, 2)  # (N, Hkv, P, D)
            # The dtypes are the ones HF's cache would hold: under autocast k (roped with the
            # float32 table) is float32 while v is the projection's bfloat16.
            cache_k = k.new_empty(self.B, w.num_kv_heads, self.S, w.head_dim)
            cache_v = v.new_empty(self.B, w.num_kv_heads, self.S, w.head_dim)
            N = k.shape[0]
            # Row n*G + g holds prompt n: copied to its G rows by broadcasting, no (B, ...) temp.
            cache_k.view(N, G, *cache_k.shape[1:])[:, :, :, :P] = k.unsqueeze(1)
            cache_v.view(N, G, *cache_v.shape[1:])[:, :, :, :P] = v.unsqueeze(1)
            self.cache_k.append(cache_k)
            self.cache_v.append(cache_v)
            attn = self.attention(q, k, v, allowed, self.scale)  # (N, P, Hq*D)
            x = x + F.linear(attn, layer.o_weight, layer.o_bias)
            x = self._mlp(layer, x)
        self.length = P
        logits = self._logits(x[:, -1])  # (N, V)
        return logits.repeat_interleave(G, dim=0)  # (B, V)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B,) long, the last chosen tokens -> the next (B, V) float32 logits."""
        if self.length >= self.S:
            raise RuntimeError(f"the KV cache holds {self.S} positions; all are filled")
        w, slot = self.weights, self.length
        cos = self.cos[self.next_position].unsqueeze(1)  # (B, 1, D)
        sin = self.sin[self.next_position].unsqueeze(1)
        allowed = self.key_ok[:, None, None, : slot + 1]  # (B, 1, 1, slot+1)
        x = F.embedding(tokens, w.embed).unsqueeze(1)  # (B, 1, H)
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer.input_norm, w.eps)
            q, k, v = self._project_qkv(layer, h)  # (B, 1, Hq|Hkv, D)
            q = apply_rope(q[:, 0], cos, sin)  # (B, Hq, D)
            self.cache_k[i][:, :, slot] = apply_rope(k[:, 0], cos, sin)
            self.cache_v[i][:, :, slot] = v[:, 0]
            keys = self.cache_k[i][:, :, : slot + 1]  # (B, Hkv, slot+1, D)
            values = self.cache_v[i][:, :, : slot + 1]
            attn = self.attention(q.unsqueeze(2), keys, values, allowed, self.scale)
            x = x + F.linear(attn, layer.o_weight, layer.o_bias)  # (B, 1, H)
            x = self._mlp(layer, x)
        self.length += 1
        self.next_position = self.next_position + 1
        return self._logits(x[:, 0])


class Sampler:
    """``generate``'s token choice for the options ``HFBackend`` passes.

    ``scores`` turns (B, V) float32 logits into the scores a token is drawn from (``-inf`` on
    every token that cannot be drawn), in ``generate``'s order: suppressed ids, then (when
    sampling) temperature, top-k, top-p.
    """

    def __init__(self, request: GenerationRequest, vocab_size: int, device: torch.device):
        self.request = request
        self.suppressed: torch.Tensor | None = None
        if request.suppressed_ids:
            self.suppressed = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.suppressed[list(request.suppressed_ids)] = True

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        r = self.request
        scores = logits
        if self.suppressed is not None:
            scores = scores.masked_fill(self.suppressed, -float("inf"))
        if not r.do_sample:
            return scores
        if r.temperature != 1.0:
            scores = scores / r.temperature
        if r.top_k != 0:
            # TopKLogitsWarper: ties with the k-th score are kept.
            k = min(max(r.top_k, 1), scores.shape[-1])
            kth = torch.topk(scores, k)[0][..., -1, None]
            scores = scores.masked_fill(scores < kth, -float("inf"))
        if r.top_p < 1.0:
            # TopPLogitsWarper: drop the low tail holding at most 1 - top_p of the mass, keep at
            # least the most likely token.
            sorted_scores, sorted_ids = torch.sort(scores, descending=False)
            cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
            sorted_drop = cumulative <= (1 - r.top_p)
            sorted_drop[..., -1:] = False
            drop = sorted_drop.scatter(1, sorted_ids, sorted_drop)
            scores = scores.masked_fill(drop, -float("inf"))
        return scores

    def choose(self, scores: torch.Tensor) -> torch.Tensor:
        """(B,) tokens drawn from ``scores`` (B, V): one multinomial draw per row, or argmax."""
        if self.request.do_sample:
            return torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        return torch.argmax(scores, dim=-1)


def check_request(request: GenerationRequest) -> None:
    """ValueError saying how to fix a request the loop cannot run."""
    if request.group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {request.group_size}")
    if request.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
    if request.prompt_ids.shape != request.prompt_mask.shape or request.prompt_ids.dim() != 2:
        raise ValueError(
            f"prompt_ids {tuple(request.prompt_ids.shape)} and prompt_mask "
            f"{tuple(request.prompt_mask.shape)} must both be (N, P)"
        )
    if not bool(request.prompt_mask[:, -1].all()):
        raise ValueError(
            "prompts must be left-padded (the last position of every row a real token); "
            "set tokenizer.padding_side = 'left'"
        )
    if request.do_sample:
        if request.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {request.temperature}")
        if not 0 < request.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {request.top_p}")
        if request.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {request.top_k}")


@dataclass(frozen=True)
class ScoreSettings:
    """What ``decode`` also reports of each drawn token, from the logits it drew from: the
    log-prob under the model's distribution at ``temperature`` (no suppressed ids, top-k or
    top-p: what the scoring forward computes) and, with ``entropy_top_p``, the top-p entropy
    of that distribution (``algorithms.topp_entropy``)."""

    temperature: float = 1.0
    entropy_top_p: float | None = None


def flush_entropy(
    pending: list[tuple[torch.Tensor, int, torch.Tensor]], entropy: torch.Tensor, top_p: float
) -> None:
    """Write the top-p entropy of each pending ``(rows, t, (R, V) logits)`` into
    ``entropy[rows, t]`` with one ``topp_entropy`` call, and empty ``pending``."""
    if not pending:
        return
    values = topp_entropy(torch.cat([z for _, _, z in pending])[None], top_p=top_p)[0]
    parts = values.split([len(rows) for rows, _, _ in pending])
    for (rows, t, _), part in zip(pending, parts, strict=True):
        entropy[rows, t] = part
    pending.clear()


def decode(
    decoder: LeanDecoder,
    request: GenerationRequest,
    vocab_size: int,
    device: torch.device,
    scores: ScoreSettings | None = None,
) -> Generation:
    """The sampling loop over a prefilled-on-demand ``decoder``: (B, T) tokens drawn with
    ``Sampler``, one ``(B, V)`` multinomial per step, until every row stopped or T steps."""
    sampler = Sampler(request, vocab_size, device)
    B, T = request.num_rows, request.max_new_tokens
    completion_ids = torch.full((B, T), request.pad_id, dtype=torch.long, device=device)
    sampler_logp = torch.zeros(B, T, dtype=torch.float32, device=device)
    logp_model = torch.zeros(B, T, dtype=torch.float32, device=device) if scores else None
    entropy = None
    if scores is not None and scores.entropy_top_p is not None:
        entropy = torch.zeros(B, T, dtype=torch.float32, device=device)
    # The steps' scaled logits whose entropy is not computed yet: one topp_entropy call for
    # many steps (up to CHUNK_LOGITS logits), not one per step.
    pending: list[tuple[torch.Tensor, int, torch.Tensor]] = []
    stop_ids = torch.tensor(request.stop_ids, dtype=torch.long, device=device)
    unfinished = torch.ones(B, dtype=torch.bool, device=device)
    steps = T
    logits = decoder.prefill()  # (B, V)
    for t in range(T):
        if t > 0:
            logits = decoder.step(completion_ids[:, t - 1])
        scored = sampler.scores(logits)  # (B, V)
        tokens = sampler.choose(scored)  # (B,)
        tokens = torch.where(unfinished, tokens, request.pad_id)
        logp = scored.gather(1, tokens[:, None]).squeeze(1) - scored.logsumexp(dim=-1)
        completion_ids[:, t] = tokens
        # A finished row's pad may have been filtered out (-inf); it counts 0.
        sampler_logp[:, t] = torch.where(unfinished, logp, 0.0)
        if scores is not None:
            # The model's own distribution, as token_logprobs scores it: logits / temperature.
            z = logits if scores.temperature == 1.0 else logits / scores.temperature
            own = z.gather(1, tokens[:, None]).squeeze(1) - z.logsumexp(dim=-1)
            logp_model[:, t] = torch.where(unfinished, own, 0.0)
            if entropy is not None:  # a finished row's entropy is padding: 0, not computed
                rows = unfinished.nonzero().squeeze(1)
                pending.append((rows, t, z[rows]))
                if sum(len(rows) for rows, _, _ in pending) * z.shape[1] >= CHUNK_LOGITS:
                    flush_entropy(pending, entropy, scores.entropy_top_p)
        if request.stop_ids:
            unfinished &= ~torch.isin(tokens, stop_ids)
            if not bool(unfinished.any()):
                steps = t + 1
                break
    if entropy is not None:
        flush_entropy(pending, entropy, scores.entropy_top_p)
    completion_ids = completion_ids[:, :steps]  # (B, T)
    return Generation(
        completion_ids=completion_ids,
        finish_reasons=finish_reasons(completion_ids, list(request.stop_ids)),
        sampler_logp=sampler_logp[:, :steps],
        weights_version=request.weights_version,
        logp=None if logp_model is None else logp_model[:, :steps],
        entropy=None if entropy is None else entropy[:, :steps],
    )


class LeanBackend:
    """Samples from a Qwen2 or Llama causal LM, or a LoRA (peft) policy on one, with a
    hand-written decode loop (module docstring).

    Keeps one set of fused weights, rebuilt when the request's ``weights_version``, the module,
    its device, the matmul dtype (autocast) or its adapters' state (disabled, merged, active)
    changes. Runs in the module's dtype, under the
    caller's ``torch.autocast`` when one is active, with the module's attention implementation
    ("eager" as transformers' eager attention, anything else as "sdpa").

    ``sampler_logp`` is the log-prob of each drawn token under the distribution it was drawn
    from (suppressed ids, temperature, top-k, top-p applied); when greedy, under the model's
    distribution at temperature 1 with the suppressed ids removed.
    """

    name: ClassVar[str] = "lean"
    samples_module: ClassVar[bool] = True

    def __init__(self) -> None:
        self.fused: FusedWeights | None = None

    def unsupported_reason(self, module: torch.nn.Module) -> str | None:
        """Why the loop cannot reproduce ``module``'s forward exactly (None: it can)."""
        return model_reason(base_model(module))

    def fused_weights(self, model: torch.nn.Module, version: int) -> FusedWeights:
        """The cached fused weights of ``model`` at ``version``, rebuilt when stale."""
        fused = self.fused
        if fused is None or not fused.matches(model, version, matmul_dtype(model)):
            self.fused = None  # free the old copy before the new one is built
            fused = self.fused = fuse_weights(model, version)
        return fused

    @torch.no_grad()
    def generate(
        self,
        module: torch.nn.Module,
        request: GenerationRequest,
        scores: ScoreSettings | None = None,
    ) -> Generation:
        """``scores``: also return the log-probs and top-p entropy of the model's distribution
        at every drawn token (``Generation.logp`` / ``entropy``, see ``ScoreSettings``). A
        Qwen2.5-VL model's prompts carry images: ``lean_vl.generate_with_images`` samples it."""
        model = self.checked_model(module, request)
        if isinstance(model, Qwen2_5_VLForConditionalGeneration):
            raise ValueError(
                "a Qwen2.5-VL model samples with its images: "
                "rollout.backends.lean_vl.generate_with_images (VisionLanguagePolicy does)"
            )
        device = model.lm_head.weight.device
        decoder = LeanDecoder(
            model,
            self.fused_weights(model, request.weights_version),
            request.prompt_ids.to(device),
            request.prompt_mask.to(device),
            request.group_size,
            request.max_new_tokens,
        )
        return decode(decoder, request, model.lm_head.weight.shape[0], device, scores)

    def checked_model(self, module: torch.nn.Module, request: GenerationRequest):
        """The transformers model of ``module`` (``modules.base_model``: a LoRA policy's
        adapter layers in place), after the checks of ``unsupported_reason`` and
        ``check_request`` (ValueError saying what to change)."""
        model = base_model(module)
        reason = model_reason(model)
        if reason is not None:
            raise ValueError(
                f"the 'lean' rollout backend cannot sample from {type(model).__name__}: "
                f"{reason}; use grpo.rollout: {{name: hf}}"
            )
        check_request(request)
        return model

    def load_weights(self, module: torch.nn.Module, version: int) -> None:
        """Nothing to copy: ``generate`` reads the trained module. Its weights were replaced
        (e.g. by a one-step off-policy run's sampling process), so the fused copy is dropped
        and rebuilt from them at the next request."""
        self.fused = None
