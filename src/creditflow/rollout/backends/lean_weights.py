"""What the ``lean`` decode loop multiplies with, and which models it can reproduce exactly.

The loop samples from a Qwen2 or Llama causal LM (``Qwen2ForCausalLM``, ``LlamaForCausalLM``:
SmolLM2 and Llama checkpoints) or Qwen2.5-VL's language model: the same decoder layer in all
of them (RMSNorm, rotary attention with grouped KV heads, a SiLU-gated MLP), differing only in
which projections carry a bias (Qwen2: q/k/v; Llama: none, or every attention projection with
``attention_bias``, every MLP one with ``mlp_bias``), all handled here by an optional bias.

A LoRA policy (a ``peft`` ``PeftModel``) samples with its adapters applied: each adapted
linear layer's weight is its merged weight ``W + scale * B @ A`` (peft's own
``get_delta_weight``), built into the fused copy; the trained module is never changed.

Shape symbols: H hidden size, Hq / Hkv query / key-value heads, D head size, I MLP size,
V vocabulary.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM, Qwen2_5_VLForConditionalGeneration, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRMSNorm

# RoPE types whose frequencies do not depend on the sequence length: their cos/sin table is
# computed once per call by the model's own rotary module. "dynamic" and "longrope" change
# their frequencies with the longest position seen so far, which a table cannot reproduce.
STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "proportional")
# The norms whose forward ``rms_norm`` reproduces (float32 normalisation, scaled in the
# input's dtype: the same code under three names).
RMS_NORMS = (Qwen2RMSNorm, Qwen2_5_VLRMSNorm, LlamaRMSNorm)
# The models the loop samples from: Qwen2 and Llama text models, and Qwen2.5-VL, whose
# language model has the same layers (its prompts prefilled by its own forward, ``lean_vl``).
SUPPORTED_MODELS = (Qwen2ForCausalLM, LlamaForCausalLM, Qwen2_5_VLForConditionalGeneration)
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LayerWeights:
    """One decoder layer's weights in the layout the loop multiplies with; a bias is None
    where the layer has none."""

    qkv_weight: torch.Tensor  # (Hq*D + 2*Hkv*D, H): q_proj, k_proj, v_proj stacked
    qkv_bias: torch.Tensor | None  # (Hq*D + 2*Hkv*D,)
    o_weight: torch.Tensor  # (H, Hq*D)
    o_bias: torch.Tensor | None  # (H,)
    gate_up_weight: torch.Tensor  # (2*I, H): gate_proj, up_proj stacked
    gate_up_bias: torch.Tensor | None  # (2*I,)
    down_weight: torch.Tensor  # (H, I)
    down_bias: torch.Tensor | None  # (H,)
    input_norm: torch.Tensor  # (H,) the module's own parameter
    post_attention_norm: torch.Tensor  # (H,) the module's own parameter


@dataclass
class FusedWeights:
    """A supported model's weights for one ``weights_version``.

    The fused QKV and gate/up weights are copies, as are the merged weights of LoRA-adapted
    layers; the other matmul weights are the module's own parameters, or copies cast to the
    autocast dtype when the call runs under ``torch.autocast`` (which would cast them on every
    call); the embedding and the norms are always the module's own. ``module`` (a weak
    reference), ``version``, ``device``, ``dtype`` and ``adapters`` are the cache key: a module
    changed in place without a new ``weights_version`` samples with partly stale weights.
    """

    module: weakref.ref
    version: int
    device: torch.device
    dtype: torch.dtype  # the matmuls' dtype: the module's, or the ambient autocast dtype
    adapters: tuple  # adapter_state(model) when fused
    layers: list[LayerWeights]
    embed: torch.Tensor  # (V, H)
    norm: torch.Tensor  # (H,)
    head: torch.Tensor  # (V, H), the embedding itself when tied and not cast
    eps: float
    num_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # D

    def matches(self, model: torch.nn.Module, version: int, dtype: torch.dtype) -> bool:
        return (
            self.module() is model
            and self.version == version
            and self.dtype == dtype
            and self.device == model.lm_head.weight.device
            and self.adapters == adapter_state(model)
        )


def matmul_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the module's linear layers run in now: the ambient autocast dtype on the
    module's device, else the module's own."""
    weight = model.lm_head.weight
    device_type = weight.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def text_decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (embedding, layers, final norm, rotary table) of a Qwen2 or Llama
    causal LM, or of a ``Qwen2_5_VLForConditionalGeneration``'s language model."""
    if isinstance(model, Qwen2_5_VLForConditionalGeneration):
        return model.model.language_model
    return model.model


def lora_linear_class() -> type | None:
    """peft's LoRA ``Linear`` layer class, or None when peft was never imported (a model
    without adapters then has none)."""
    if "peft" not in sys.modules:
        return None
    from peft.tuners.lora import Linear  # noqa: PLC0415 - optional dependency

    return Linear


def decoder_linears(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``"layers.{i}.{name}"`` -> the projection module of every decoder layer."""
    config = model.config.get_text_config()
    linears = {}
    for i, layer in enumerate(text_decoder(model).layers[: config.num_hidden_layers]):
        parts = {**dict(layer.self_attn.named_children()), **dict(layer.mlp.named_children())}
        for name in LINEAR_NAMES:
            linears[f"layers.{i}.{name}"] = parts[name]
    return linears


def adapter_state(model: torch.nn.Module) -> tuple:
    """What decides the LoRA layers' forward besides their weights: per layer whether the
    adapters are disabled or merged and which are active (empty without adapters)."""
    lora = lora_linear_class()
    if lora is None:
        return ()
    return tuple(
        (name, bool(m.disable_adapters), bool(m.merged), tuple(m.active_adapters))
        for name, m in decoder_linears(model).items()
        if isinstance(m, lora)
    )


def lora_reason(linear: torch.nn.Module) -> str | None:
    """Why a peft LoRA ``Linear``'s forward is not ``base_layer`` plus its merged delta."""
    if type(linear.base_layer) is not torch.nn.Linear:
        return f"its base layer is a {type(linear.base_layer).__name__}"
    for adapter in linear.active_adapters:
        if adapter not in linear.lora_A:
            continue
        if adapter in getattr(linear, "lora_variant", {}) or linear.use_dora.get(adapter):
            return f"adapter {adapter!r} is a LoRA variant (DoRA or another), not plain LoRA"
        if getattr(linear, "lora_bias", {}).get(adapter):
            return f"adapter {adapter!r} has a bias (lora_bias)"
    return None


def effective_linear(
    linear: torch.nn.Module,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight (out, in), bias (out,) or None)`` the layer's forward multiplies with: a plain
    Linear's own parameters; a LoRA layer's base weight plus the delta of every active adapter
    (a new tensor), or the base weight alone when its adapters are disabled or merged into it."""
    lora = lora_linear_class()
    if lora is None or not isinstance(linear, lora):
        return linear.weight, linear.bias
    base = linear.base_layer
    if linear.disable_adapters or linear.merged:
        return base.weight, base.bias
    weight = base.weight
    for adapter in linear.active_adapters:
        if adapter in linear.lora_A:
            weight = weight + linear.get_delta_weight(adapter).to(weight.dtype)
    return weight, base.bias


def fuse_weights(model: torch.nn.Module, version: int) -> FusedWeights:
    """The fused weights of ``model``'s current parameters (see ``FusedWeights``)."""
    config = model.config.get_text_config()
    decoder = text_decoder(model)
    dtype = matmul_dtype(model)

    def cast(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return None if tensor is None else tensor.detach().to(dtype)

    def stacked(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
        if all(t is None for t in tensors):
            return None
        if any(t is None for t in tensors):
            raise ValueError("the fused projections must all have a bias or all have none")
        return cast(torch.cat(tensors))

    linears = decoder_linears(model)
    layers = []
    with torch.no_grad():
        for i, layer in enumerate(decoder.layers[: config.num_hidden_layers]):
            w = {name: effective_linear(linears[f"layers.{i}.{name}"]) for name in LINEAR_NAMES}
            layers.append(
                LayerWeights(
                    qkv_weight=stacked([w[n][0] for n in ("q_proj", "k_proj", "v_proj")]),
                    qkv_bias=stacked([w[n][1] for n in ("q_proj", "k_proj", "v_proj")]),
                    o_weight=cast(w["o_proj"][0]),
                    o_bias=cast(w["o_proj"][1]),
                    gate_up_weight=stacked([w["gate_proj"][0], w["up_proj"][0]]),
                    gate_up_bias=stacked([w["gate_proj"][1], w["up_proj"][1]]),
                    down_weight=cast(w["down_proj"][0]),
                    down_bias=cast(w["down_proj"][1]),
                    input_norm=layer.input_layernorm.weight.detach(),
                    post_attention_norm=layer.post_attention_layernorm.weight.detach(),
                )
            )
    attn = decoder.layers[0].self_attn
    return FusedWeights(
        module=weakref.ref(model),
        version=version,
        device=model.lm_head.weight.device,
        dtype=dtype,
        adapters=adapter_state(model),
        layers=layers,
        embed=decoder.embed_tokens.weight.detach(),
        norm=decoder.norm.weight.detach(),
        head=cast(model.lm_head.weight),
        eps=decoder.norm.variance_epsilon,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=attn.head_dim,
    )


def config_reason(config) -> str | None:
    """What in a Qwen2 or Llama text config the loop does not implement (None: nothing)."""
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "use_sliding_window", False) or any(
        t != "full_attention" for t in layer_types
    ):
        return "sliding-window attention"
    rope_type = (config.rope_parameters or {}).get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        return f"RoPE type {rope_type!r} (supported: {list(STATIC_ROPE_TYPES)})"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r} (only 'silu')"
    if config.attention_dropout:
        return f"attention_dropout {config.attention_dropout} (only 0)"
    return None


def layers_reason(model: torch.nn.Module) -> str | None:
    """A layer whose forward is not the plain one (a quantised linear, an adapter other than
    plain LoRA), else None."""
    lora = lora_linear_class()
    for key, linear in decoder_linears(model).items():
        if lora is not None and isinstance(linear, lora):
            reason = lora_reason(linear)
            if reason is not None:
                return f"{key} is a LoRA layer whose {reason}"
        elif type(linear) is not torch.nn.Linear:
            return (
                f"{key} is a {type(linear).__name__}, not a torch.nn.Linear or a plain LoRA "
                "layer (quantised layers and other adapters are not fused)"
            )
    config = model.config.get_text_config()
    for i, layer in enumerate(text_decoder(model).layers[: config.num_hidden_layers]):
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if any(type(norm) not in RMS_NORMS for norm in norms):
            names = [n.__name__ for n in RMS_NORMS]
            return f"layer {i} has a norm other than {names}"
    if type(model.lm_head) is not torch.nn.Linear or model.lm_head.bias is not None:
        return "the LM head is not a bias-free torch.nn.Linear"
    return None


def model_reason(model: torch.nn.Module) -> str | None:
    """Why the loop cannot reproduce the forward of ``model`` (a bare transformers model, a
    PeftModel already unwrapped), or None when it can."""
    if type(model) not in SUPPORTED_MODELS:
        names = ", ".join(m.__name__ for m in SUPPORTED_MODELS)
        return f"{type(model).__name__} is not one of the supported models ({names})"
    return config_reason(model.config.get_text_config()) or layers_reason(model)
