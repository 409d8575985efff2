"""The ``lean`` decode loop for Qwen2.5-VL: its language model is a Qwen2 decoder, so after the
prompts are prefilled the steps are ``LeanDecoder.step``'s.

Shape symbols as in ``lean``: N prompts, G completions per prompt, B = N * G rows, P prompt
tokens (left-padded), T new tokens, S cache slots, Hkv key-value heads, D head size, V
vocabulary.

The prefill is the model's own forward over the N prompts (vision tower, patch merger and the
image embeddings scattered into the text, exactly as ``generate``'s first step), with the 3-D
rope positions ``get_rope_index`` derives from the prompt; its KV cache is copied to the G
rows of each prompt. Every later token is text: ``generate`` places it at position
``max(prompt positions) + 1 + t`` on all three rope axes (the prompt's ``rope_deltas`` plus
the count of real tokens), and a rope with three equal axes is the plain 1-D rope of that
position, so the steps read one ``(positions, D)`` cos/sin table from the model's own rotary
module, as for a text model.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, Qwen2_5_VLForConditionalGeneration

from creditflow.rollout.backends.base import Generation, GenerationRequest
from creditflow.rollout.backends.lean import (
    ATTENTIONS,
    LeanBackend,
    LeanDecoder,
    ScoreSettings,
    decode,
    sdpa_attention,
)
from creditflow.rollout.backends.lean_weights import FusedWeights


@torch.no_grad()
def generate_with_images(
    backend: LeanBackend,
    module: torch.nn.Module,
    request: GenerationRequest,
    image_inputs: dict[str, torch.Tensor],
    scores: ScoreSettings | None = None,
) -> Generation:
    """``LeanBackend.generate`` for a Qwen2.5-VL ``module`` whose N prompts carry images:
    ``image_inputs`` holds their ``pixel_values`` (the model's flat layout), ``image_grid_thw``
    (N, 3) and ``mm_token_type_ids`` (N, P); each prompt is prefilled once for its G rows."""
    model = backend.checked_model(module, request)
    if not isinstance(model, Qwen2_5_VLForConditionalGeneration):
        raise ValueError(f"{type(model).__name__} takes no images; use LeanBackend.generate")
    device = model.lm_head.weight.device
    decoder = VisionDecoder(
        model,
        backend.fused_weights(model, request.weights_version),
        request.prompt_ids.to(device),
        request.prompt_mask.to(device),
        request.group_size,
        request.max_new_tokens,
        {k: v.to(device) for k, v in image_inputs.items()},
    )
    return decode(decoder, request, model.lm_head.weight.shape[0], device, scores)


class VisionDecoder(LeanDecoder):
    """``LeanDecoder`` whose prompts carry images (module docstring).

    Args:
        model: the ``Qwen2_5_VLForConditionalGeneration`` the weights were fused from.
        weights: its language model's fused weights.
        prompt_ids, prompt_mask: (N, P), left-padded.
        group_size, max_new_tokens: G and T.
        image_inputs: the N prompts' ``pixel_values`` (the model's flat layout),
            ``image_grid_thw`` (N, 3) and ``mm_token_type_ids`` (N, P).
    """

    def __init__(  # noqa: PLR0913 - LeanDecoder's arguments plus the images
        self,
        model: Qwen2_5_VLForConditionalGeneration,
        weights: FusedWeights,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group_size: int,
        max_new_tokens: int,
        image_inputs: dict[str, torch.Tensor],
    ):
        missing = {"pixel_values", "image_grid_thw", "mm_token_type_ids"} - set(image_inputs)
        if missing:
            raise ValueError(f"a Qwen2.5-VL prompt needs its {sorted(missing)}")
        self.model = model
        self.image_inputs = image_inputs
        self.weights = weights
        self.prompt_ids = prompt_ids  # (N, P)
        self.prompt_mask = prompt_mask.bool()  # (N, P)
        self.G = group_size
        N, self.P = prompt_ids.shape
        self.B = N * group_size
        self.S = self.P + max_new_tokens
        self.scale = weights.head_dim**-0.5
        text_config = model.config.get_text_config()
        self.attention = ATTENTIONS.get(text_config._attn_implementation, sdpa_attention)
        # The prompt's 3-D positions, and where its text continues: max position + 1.
        self.prompt_positions, deltas = model.model.get_rope_index(
            prompt_ids,
            mm_token_type_ids=image_inputs["mm_token_type_ids"],
            image_grid_thw=image_inputs["image_grid_thw"],
            attention_mask=prompt_mask,
        )  # (3, N, P), (N, 1)
        start = deltas[:, 0].to(prompt_ids.device) + prompt_mask.sum(dim=1)  # (N,)
        self.next_position = start.repeat_interleave(group_size)  # (B,)
        positions = torch.arange(int(start.max()) + max_new_tokens, device=prompt_ids.device)
        probe = weights.embed[:1].unsqueeze(0)  # (1, 1, H): only its dtype and device are read
        cos, sin = model.model.language_model.rotary_emb(probe, positions.view(1, 1, -1))
        self.cos, self.sin = cos[0], sin[0]  # (positions, D), three equal axes
        self.key_ok = torch.ones(self.B, self.S, dtype=torch.bool, device=prompt_ids.device)
        self.key_ok[:, : self.P] = self.prompt_mask.repeat_interleave(group_size, dim=0)
        self.cache_k: list[torch.Tensor] = []  # L of (B, Hkv, S, D)
        self.cache_v: list[torch.Tensor] = []
        self.length = 0

    def prefill(self) -> torch.Tensor:
        """The prompts (with their images) through the model's forward once each, their KV
        into the cache; returns the first token's (B, V) float32 logits."""
        G, P = self.G, self.P
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=self.prompt_ids,
            attention_mask=self.prompt_mask.long(),
            position_ids=self.prompt_positions,
            pixel_values=self.image_inputs["pixel_values"],
            image_grid_thw=self.image_inputs["image_grid_thw"],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # (N, Hkv, P, D)
            N = k.shape[0]
            cache_k = k.new_empty(self.B, k.shape[1], self.S, k.shape[3])
            cache_v = v.new_empty(self.B, v.shape[1], self.S, v.shape[3])
            # Row n*G + g holds prompt n: copied to its G rows by broadcasting.
            cache_k.view(N, G, *cache_k.shape[1:])[:, :, :, :P] = k.unsqueeze(1)
            cache_v.view(N, G, *cache_v.shape[1:])[:, :, :, :P] = v.unsqueeze(1)
            self.cache_k.append(cache_k)
            self.cache_v.append(cache_v)
        self.length = P
        logits = out.logits[:, -1].float()  # (N, V)
        return logits.repeat_interleave(G, dim=0)  # (B, V)
