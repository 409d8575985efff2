"""Token log-probs (and ToR's top-p entropy) through a linear output head, a chunk at a time.

Shapes: ``B`` sequences, ``T`` scored tokens, ``H`` hidden size, ``V`` vocabulary, ``N = B * T``
positions, ``R`` positions of one chunk. At Qwen2.5's V = 151,936 one float32 ``(B, T, V)``
logits tensor of a GRPO batch (B 32, T 64) is 1.2 GB, and autograd keeps it (and its
gradient) through the backward pass. Here the head and the log-softmax are fused
into one autograd function that holds at most one ``(R, V)`` chunk of logits at a time, in
the forward and in the backward pass alike.
"""

import torch
import torch.nn.functional as F

from creditflow.algorithms._validate import check_ndim
from creditflow.algorithms.tor import topp_entropy

# Logits of one chunk: 2**24 floats = 64 MiB in float32. At a small vocabulary (V ~ 1k) a
# whole GRPO batch fits in one chunk.
CHUNK_LOGITS = 2**24


def chunk_rows(vocab_size: int, chunk_size: int | None = None) -> int:
    """Positions per chunk: ``chunk_size``, or as many as ``CHUNK_LOGITS`` logits allow.

    >>> chunk_rows(151_936), chunk_rows(1026), chunk_rows(1026, chunk_size=8)
    (110, 16352, 8)
    """
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
        return chunk_size
    return max(1, CHUNK_LOGITS // max(1, vocab_size))


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_top_p: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax((hidden @ weight.T + bias) / temperature)`` at ``token_ids``, chunked.

    Equal (to float rounding) to the single-pass computation, and so is its gradient with
    respect to ``hidden``, ``weight`` and ``bias``, but no ``(B, T, V)`` tensor is made: the
    ``N`` positions are scored ``chunk_rows(V, chunk_size)`` at a time, and the backward pass
    recomputes each chunk's logits from ``hidden`` (one more head matmul) instead of keeping
    them, with ``d logp_t / d z_t = (onehot(y_t) - softmax(z_t)) / temperature``.

    Args:
        hidden: ``(B, T, H)`` the hidden states the head projects (a causal LM's final norm
            output at the positions that predict ``token_ids``).
        weight: ``(V, H)`` the linear head's weight (tied to the input embedding in small
            Qwen2.5 checkpoints).
        token_ids: ``(B, T)`` long, the tokens to score.
        bias: ``(V,)`` the head's bias, if it has one.
        temperature: divides the logits.
        chunk_size: positions per chunk; None: ``CHUNK_LOGITS // V`` (all of them at a small V).
        entropy_top_p: also return the top-p entropy (``tor.topp_entropy``, no grad) of each
            position's distribution at this top-p; None: don't.

    Returns:
        ``(logp, entropy)``: ``(B, T)`` float32 log-probs (float64 for float64 inputs; with
        grad when enabled) and the
        ``(B, T)`` float32 entropies, or None without ``entropy_top_p``. The head's matmul runs
        in the dtype autocast picks, the softmax in float32; the backward runs in float32.
    """
    check_ndim("hidden", hidden, 3, "(B, T, H)")
    check_ndim("weight", weight, 2, "(V, H)")
    B, T, H = hidden.shape
    if token_ids.shape != (B, T):
        raise ValueError(
            f"token_ids must have shape (B, T) = {(B, T)}, got {tuple(token_ids.shape)}"
        )
    if weight.shape[1] != H:
        raise ValueError(f"weight must be (V, H) with H = {H}, got {tuple(weight.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be (V,) = {tuple(weight.shape[:1])}, got {tuple(bias.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows = chunk_rows(weight.shape[0], chunk_size)
    logp, entropy = _LinearTokenLogprobs.apply(
        hidden.reshape(B * T, H),
        weight,
        bias,
        token_ids.reshape(B * T),
        temperature,
        rows,
        entropy_top_p,
    )  # (N,), (N,) or (0,)
    return logp.view(B, T), (entropy.view(B, T) if entropy_top_p is not None else None)


def _score_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """float32, or float64 for float64 inputs (the tests' gradient checks)."""
    return torch.float64 if torch.float64 in (hidden.dtype, weight.dtype) else torch.float32


def _chunk_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``(R, V)`` logits of one chunk ``hidden`` (R, H) in ``dtype``, divided by
    ``temperature``."""
    logits = F.linear(hidden, weight, bias).to(dtype)
    # x / 1.0 is x: skipping it saves one pass over (R, V) and changes no value.
    return logits if temperature == 1.0 else logits.div_(temperature)


class _LinearTokenLogprobs(torch.autograd.Function):
    """The fused head + log-softmax of ``token_logprobs`` on flat ``(N, H)`` hidden states."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, token_ids, temperature, rows, entropy_top_p):
        N = hidden.shape[0]
        dtype = _score_dtype(hidden, weight)
        logp = hidden.new_empty(N, dtype=dtype)
        lse = hidden.new_empty(N, dtype=dtype)  # log-normaliser, kept for backward
        entropy = hidden.new_empty(N if entropy_top_p is not None else 0, dtype=torch.float32)
        for start in range(0, N, rows):
            chunk = slice(start, start + rows)
            logits = _chunk_logits(hidden[chunk], weight, bias, temperature, dtype)  # (R, V)
            # logsumexp: no second (R, V) tensor, which log_softmax + gather would make.
            lse[chunk] = torch.logsumexp(logits, dim=-1)
            logp[chunk] = logits.gather(-1, token_ids[chunk, None]).squeeze(-1) - lse[chunk]
            if entropy_top_p is not None:
                entropy[chunk] = topp_entropy(logits[None], top_p=entropy_top_p)[0]
        ctx.save_for_backward(hidden, weight, bias, token_ids, lse)
        ctx.temperature, ctx.rows = temperature, rows
        # The backward's recomputed logits must be the forward's: same autocast state.
        device = hidden.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, token_ids, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        temperature = ctx.temperature
        device, autocast_on, autocast_dtype = ctx.autocast
        dtype = lse.dtype  # the head's backward runs in float32 (float64 for float64 inputs)
        weight_full = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden, dtype=dtype) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=dtype) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=dtype) if need_bias else None
        for start in range(0, hidden.shape[0], ctx.rows):
            chunk = slice(start, start + ctx.rows)
            g = grad_logp[chunk, None].to(dtype)  # (R, 1)
            with torch.autocast(device, dtype=autocast_dtype, enabled=autocast_on):
                logits = _chunk_logits(hidden[chunk], weight, bias, temperature, dtype)  # (R, V)
            # dL/dz = g * (onehot(y) - softmax(z)) / temperature, built in place in `logits`.
            grad_z = logits.sub_(lse[chunk, None]).exp_().mul_(-g)
            grad_z.scatter_add_(1, token_ids[chunk, None], g)
            if temperature != 1.0:
                grad_z.div_(temperature)
            if need_hidden:
                grad_hidden[chunk] = grad_z @ weight_full  # (R, H)
            if need_weight:
                grad_weight.addmm_(grad_z.t(), hidden[chunk].to(dtype))  # (V, H)
            if need_bias:
                grad_bias += grad_z.sum(dim=0)
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
            None,
        )
