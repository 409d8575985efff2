"""The vision-language policy for ToR (docs/methods/tor.md): a tiny Qwen2.5-VL, its processor and inputs.

No checkpoint can be downloaded here, so the embedded default is a randomly initialised
``Qwen2_5_VLForConditionalGeneration`` built from a real ``Qwen2_5_VLConfig`` (3D "mrope",
windowed ViT, patch merger), with a locally trained tokenizer and the PIL image processor.
A real checkpoint loads through ``models.load_policy`` (``source: pretrained``).

Shape symbols: ``B`` sequences, ``P`` prompt tokens, ``T`` completion tokens, ``V`` vocabulary,
``N`` image patches of the whole batch (each ``C * temporal_patch_size * patch_size**2`` wide,
1176 for 3 channels, 2 frames and 14-pixel patches).

Positions (the answer to "what must a log-prob recomputation pass?"). Qwen2.5-VL places text
tokens on a 1D axis and image tokens on a (t, h, w) grid; ``get_rope_index`` derives these 3D
positions from ``input_ids``, ``mm_token_type_ids`` (0 text, 1 image), ``image_grid_thw`` and
``attention_mask``. In transformers 5.x the model only computes them when
``mm_token_type_ids`` is passed; without it (or with 2D ``position_ids`` as a text-only engine
passes) every image token gets its own 1D position and the log-probs drift from those of
``generate`` (measured: ~1e-3 nats on the random tiny model; systematic, not noise). So
one forward over ``[prompt, completion]`` needs ``input_ids``, ``attention_mask`` (prompt mask then
completion mask), ``mm_token_type_ids`` (the prompt's, then zeros), ``pixel_values`` and
``image_grid_thw`` and **no** ``position_ids``; there is no ``cache_position`` argument.
``sequence_forward_inputs`` assembles exactly that.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from PIL import Image
from transformers import (
    AutoProcessor,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessorPil,
)
from transformers.utils import is_torchvision_available

from creditflow.config.policy import ATTN_IMPLEMENTATIONS
from creditflow.models.tokenizer import train_bpe_tokenizer

VISION_START_TOKEN = "<|vision_start|>"
VISION_END_TOKEN = "<|vision_end|>"
VISION_PAD_TOKEN = "<|vision_pad|>"
IMAGE_PAD_TOKEN = "<|image_pad|>"  # Qwen2_5_VLProcessor.image_token
VIDEO_PAD_TOKEN = "<|video_pad|>"  # Qwen2_5_VLProcessor.video_token (its id is looked up too)
# Qwen2.5-VL's vision markers, in the relative order of the real vocabulary (151652..151656).
VISION_TOKENS = (
    VISION_START_TOKEN,
    VISION_END_TOKEN,
    VISION_PAD_TOKEN,
    IMAGE_PAD_TOKEN,
    VIDEO_PAD_TOKEN,
)
IMAGE_PLACEHOLDER = VISION_START_TOKEN + IMAGE_PAD_TOKEN + VISION_END_TOKEN

# ChatML as in creditflow.models.tokenizer, plus Qwen2.5-VL's rendering of list content:
# {"type": "image"} -> <|vision_start|><|image_pad|><|vision_end|>, {"type": "text"} -> its text.
# The processor then expands the single <|image_pad|> to one token per merged patch.
VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' %}"
    "{{- item['text'] }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):
    """``Qwen2_5_VLProcessor`` without the video processor, so it works without torchvision.

    transformers 5.x builds every video processor on torchvision, and ``ProcessorMixin``
    type-checks (and ``from_pretrained`` instantiates) each sub-processor named in
    ``__init__`` even when it is ``None``; the stock class therefore cannot be created or
    loaded without torchvision, even for images only (huggingface/transformers#48558). This
    subclass names only ``image_processor`` and ``tokenizer``; image handling (placeholder
    expansion, ``mm_token_type_ids``) is inherited unchanged. Importing this module registers
    it with ``AutoProcessor``, so a directory it saved loads with ``AutoProcessor``.
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


# A saved directory names the class in processor_config.json; AutoProcessor finds classes
# outside transformers only through this registry. exist_ok: the qwen2_5_vl key is taken by
# the stock class, which stays the one used for checkpoints that name it.
AutoProcessor.register(Qwen2_5_VLConfig, ImageOnlyQwen2_5_VLProcessor, exist_ok=True)


def train_vl_tokenizer(
    texts: Sequence[str],
    vocab_size: int = 1024,
    *,
    special_tokens: Sequence[str] = (),
    min_frequency: int = 2,
    model_max_length: int = 512,
) -> PreTrainedTokenizerBase:
    """``train_bpe_tokenizer`` plus Qwen2.5-VL's vision tokens and an image-aware chat template.

    Args:
        texts: training corpus (the prompts and targets the policy will see).
        vocab_size: BPE vocabulary including bytes and control tokens; the five
            ``VISION_TOKENS`` and ``special_tokens`` are added on top.
        special_tokens: extra regular marker tokens, as in ``train_bpe_tokenizer``.
        min_frequency, model_max_length: as in ``train_bpe_tokenizer``.

    Returns:
        A fast tokenizer padding on the left, ``<|endoftext|>`` pad (id 0), ``<|im_end|>`` eos
        (id 2), the ``VISION_TOKENS`` as *special* tokens (one id each, dropped by
        ``decode(..., skip_special_tokens=True)``, as in the real Qwen2.5-VL vocabulary) and
        ``VL_CHAT_TEMPLATE``.
    """
    clashes = sorted(set(special_tokens) & set(VISION_TOKENS))
    if clashes:
        raise ValueError(f"special_tokens must not repeat the vision tokens; got {clashes}")
    tokenizer = train_bpe_tokenizer(
        texts,
        vocab_size,
        special_tokens=special_tokens,
        chat_template=VL_CHAT_TEMPLATE,
        min_frequency=min_frequency,
        model_max_length=model_max_length,
    )
    # Appended after the BPE vocabulary; replace_extra_special_tokens=False keeps <|im_start|>.
    tokenizer.add_special_tokens(
        {"extra_special_tokens": list(VISION_TOKENS)}, replace_extra_special_tokens=False
    )
    return tokenizer


def build_tiny_processor(
    tokenizer: PreTrainedTokenizerBase,
    image_size: int = 112,
    *,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> ImageOnlyQwen2_5_VLProcessor:
    """A Qwen2.5-VL processor that turns every image into about ``image_size**2`` pixels.

    ``min_pixels = max_pixels = image_size**2``: a square image of any size is resized to
    ``image_size x image_size``, giving ``(image_size / patch_size)**2`` patches and
    ``(image_size / (patch_size * merge_size))**2`` image tokens (112 -> 64 patches ->
    16 tokens). Uses the PIL image processor (``Qwen2VLImageProcessorPil``); the torchvision
    one would need torchvision.

    Args:
        tokenizer: from ``train_vl_tokenizer`` (needs the ``VISION_TOKENS``); its chat
            template becomes the processor's.
        image_size: side of the square the images are resized to; a multiple of
            ``patch_size * merge_size``.
        patch_size, merge_size, temporal_patch_size: the ViT's patching; the model must use
            the same (``build_tiny_qwen2_5_vl`` reads them from the processor).
    """
    missing = [token for token in VISION_TOKENS if token not in tokenizer.get_vocab()]
    if missing:
        raise ValueError(
            f"the tokenizer lacks the vision tokens {missing}; build it with train_vl_tokenizer"
        )
    factor = patch_size * merge_size
    if image_size < factor or image_size % factor:
        raise ValueError(
            f"image_size must be a positive multiple of patch_size * merge_size = {factor}, "
            f"got {image_size}"
        )
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=image_size * image_size,
        max_pixels=image_size * image_size,
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
    )
    tokenizer.padding_side = "left"
    return ImageOnlyQwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


def build_tiny_qwen2_5_vl(
    processor_or_tokenizer: ImageOnlyQwen2_5_VLProcessor | PreTrainedTokenizerBase,
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    vision_depth: int = 2,
    vision_hidden_size: int = 32,
    vision_num_heads: int = 2,
    vision_intermediate_size: int = 64,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    attn_implementation: str = "eager",
) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised Qwen2.5-VL sized for CPU tests and smoke runs.

    Real ``Qwen2_5_VLConfig`` (text + vision sub-configs), so every code path (windowed ViT,
    patch merger, 3D rope, left-padded generation, ``save_pretrained``) is the one a real
    checkpoint takes. The text rope sections keep Qwen2.5-VL's 1:1.5:1.5 split of
    ``head_dim / 2`` over (t, h, w) (``[16, 24, 24]`` there, ``[2, 3, 3]`` for head_dim 16).
    The last ViT block attends over the full image, the others in 112-pixel windows, as in
    Qwen2.5-VL (where every eighth block is global).

    Args:
        processor_or_tokenizer: sets ``V = len(tokenizer)`` and the pad/eos/vision token ids;
            a processor also sets ``patch_size``/``merge_size``/``temporal_patch_size``
            (14/2/2 otherwise).
        hidden_size: text width, also the ViT merger's output width (``out_hidden_size``).
        vision_hidden_size: must be divisible by ``vision_num_heads``, and the ViT head
            width by 4 (its axial rope splits it over h and w).
        seed: weights depend only on it; the global torch RNG is left untouched.
        attn_implementation: one of ``ATTN_IMPLEMENTATIONS`` (text and vision).

    Returns:
        The model in eval mode; ``model(**inputs).logits`` is ``(B, P, V)``.
    """
    processor = processor_or_tokenizer if hasattr(processor_or_tokenizer, "tokenizer") else None
    tokenizer = processor.tokenizer if processor is not None else processor_or_tokenizer
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"unknown attn_implementation {attn_implementation!r}; "
            f"valid: {list(ATTN_IMPLEMENTATIONS)}"
        )
    head_dim = _head_dim(hidden_size, num_attention_heads, "hidden_size", "num_attention_heads")
    if num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({num_attention_heads}) must be divisible by "
            f"num_key_value_heads ({num_key_value_heads})"
        )
    if head_dim % 2 or head_dim < 6:
        raise ValueError(f"the text head width must be even and >= 6, got {head_dim}")
    vision_head_dim = _head_dim(
        vision_hidden_size, vision_num_heads, "vision_hidden_size", "vision_num_heads"
    )
    if vision_head_dim % 4:
        raise ValueError(
            f"the ViT head width (vision_hidden_size / vision_num_heads = {vision_head_dim}) "
            "must be divisible by 4"
        )
    if vision_depth < 1:
        raise ValueError(f"vision_depth must be >= 1, got {vision_depth}")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError(
            "the tokenizer needs a pad and an eos token (train_vl_tokenizer sets both)"
        )
    vocab = tokenizer.get_vocab()
    missing = [token for token in VISION_TOKENS if token not in vocab]
    if missing:
        raise ValueError(
            f"the tokenizer lacks the vision tokens {missing}; build it with train_vl_tokenizer"
        )

    image_processor = processor.image_processor if processor is not None else None
    patch_size = getattr(image_processor, "patch_size", 14)
    merge_size = getattr(image_processor, "merge_size", 2)
    temporal_patch_size = getattr(image_processor, "temporal_patch_size", 2)
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "max_position_embeddings": max_position_embeddings,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000.0,  # Qwen2.5-VL's
            "mrope_section": _mrope_section(head_dim),
        },
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    vision_config = {
        "depth": vision_depth,
        "hidden_size": vision_hidden_size,
        "intermediate_size": vision_intermediate_size,
        "num_heads": vision_num_heads,
        "patch_size": patch_size,
        "spatial_merge_size": merge_size,
        "temporal_patch_size": temporal_patch_size,
        "window_size": 112,  # pixels, Qwen2.5-VL's
        "fullatt_block_indexes": [vision_depth - 1],
        "out_hidden_size": hidden_size,  # merged patches are fed as text embeddings
    }
    config = Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=vocab[IMAGE_PAD_TOKEN],
        video_token_id=vocab[VIDEO_PAD_TOKEN],
        vision_start_token_id=vocab[VISION_START_TOKEN],
        vision_end_token_id=vocab[VISION_END_TOKEN],
        tie_word_embeddings=tie_word_embeddings,
        attn_implementation=attn_implementation,
    )
    # fork_rng restores the global CPU generator afterwards (see build_tiny_qwen2).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


def _head_dim(width: int, heads: int, width_name: str, heads_name: str) -> int:
    if heads < 1 or width % heads:
        raise ValueError(f"{width_name} ({width}) must be divisible by {heads_name} ({heads})")
    return width // heads


def _mrope_section(head_dim: int) -> list[int]:
    """(t, h, w) split of the ``head_dim / 2`` rotary frequencies, Qwen2.5-VL's 1:1.5:1.5."""
    half = head_dim // 2
    temporal = max(1, half // 4)
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]


def load_processor(name_or_path: str, model: PreTrainedModel, trust_remote_code: bool) -> Any:
    """A vision-language checkpoint's own processor."""
    # The stock Qwen2_5_VLProcessor needs torchvision for its video processor (see
    # ImageOnlyQwen2_5_VLProcessor); images alone do not.
    if model.config.model_type == "qwen2_5_vl" and not is_torchvision_available():
        return ImageOnlyQwen2_5_VLProcessor.from_pretrained(name_or_path)
    return AutoProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)


def freeze_vision_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (in place) with its vision encoder frozen: every parameter of the vision
    tower (``...visual.*``, a peft wrapper's names included) except the patch merger, the
    projector into the language model, stops requiring gradients; returns ``model``.

    Why (docs/results.md "The ToR world"): trained from scratch together with the language model, the
    tiny policy's ViT collapses to an image-independent output within the SFT warm start
    (measured: the SFT loss was the same, to 1e-7, with the pictures of other problems), so no
    answer depends on the picture; its random initialisation keeps the pictures apart, and the
    merger learns to read them, as LLaVA-style recipes train only the projector.

    Raises:
        ValueError: ``model`` has no ``visual`` parameters (not a vision-language model).
    """
    vision = [(n, p) for n, p in model.named_parameters() if ".visual." in f".{n}"]
    if not vision:
        raise ValueError(f"{type(model).__name__} has no vision tower (no 'visual.' parameters)")
    for name, parameter in vision:
        if ".merger." not in name:
            parameter.requires_grad_(False)
    return model


def vision_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids of the ``VISION_TOKENS``, e.g. for ``generate(..., suppress_tokens=...)``.

    A sampled ``<|image_pad|>`` inside a completion makes the recomputation forward fail
    (the model counts image placeholders against image features), so a rollout engine
    suppresses these ids; an untrained policy samples them at about ``5 / V`` per token.
    """
    vocab = tokenizer.get_vocab()
    return [vocab[token] for token in VISION_TOKENS if token in vocab]


def _chat_prompts(processor: Any, prompts: Sequence[str], *, with_image: bool) -> list[str]:
    """The rendered user turn plus the assistant header, with or without the image item.

    A real checkpoint may keep its chat template on the processor only (Qwen2.5-VL ships
    ``chat_template.json``), so the processor's is preferred over the tokenizer's.
    """
    render = (
        processor.apply_chat_template
        if getattr(processor, "chat_template", None)
        else processor.tokenizer.apply_chat_template
    )
    image_item = [{"type": "image"}] if with_image else []
    return [
        render(
            [{"role": "user", "content": [*image_item, {"type": "text", "text": prompt}]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for prompt in prompts
    ]


def vl_prompt_inputs(
    processor: Any, prompts: Sequence[str], images: Sequence[Image.Image]
) -> dict[str, torch.Tensor]:
    """Left-padded model inputs for user turns of one image followed by the prompt text.

    Args:
        processor: a Qwen2.5-VL processor (``build_tiny_processor`` or a checkpoint's).
        prompts: ``B`` user texts (e.g. ``tor_prompt(question)``); the image comes first in
            the turn, as Qwen2.5-VL is prompted. To sample ``G`` completions per prompt,
            repeat each prompt and its image ``G`` times.
        images: ``B`` PIL images, one per prompt.

    Returns:
        ``input_ids`` and ``attention_mask`` ``(B, P)`` (left padding, mask 1 on real
        tokens), ``mm_token_type_ids`` ``(B, P)`` (1 on image tokens), ``pixel_values``
        ``(N, C * temporal_patch_size * patch_size**2)`` (the patches of all images in batch
        order) and ``image_grid_thw`` ``(B, 3)`` (patch grid per image).
    """
    if len(prompts) != len(images) or not prompts:
        raise ValueError(
            f"need one image per prompt and at least one prompt; got {len(prompts)} prompts "
            f"and {len(images)} images"
        )
    encoded = processor(
        text=_chat_prompts(processor, prompts, with_image=True),
        images=list(images),
        padding=True,
        padding_side="left",
        return_tensors="pt",
        add_special_tokens=False,  # the chat template already wrote every marker
    )
    return dict(encoded)


def text_only_prompt_inputs(processor: Any, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
    """The same user turns with the image removed: ToR's "no image" pass (docs/methods/tor.md).

    The visual sensitivity ``|log pi(o_t | image, q) - log pi(o_t | no image, q)|`` compares
    the same completion under both prompts; here the image item is dropped from the chat
    turn, so there are no vision tokens and no pixels.

    Returns:
        ``input_ids``, ``attention_mask`` and ``mm_token_type_ids`` (all 0), each ``(B, P')``,
        left-padded.
    """
    if not prompts:
        raise ValueError("need at least one prompt")
    encoded = processor.tokenizer(
        _chat_prompts(processor, prompts, with_image=False),
        padding=True,
        padding_side="left",
        return_tensors="pt",
        add_special_tokens=False,  # the chat template already wrote every marker
    )
    return {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "mm_token_type_ids": torch.zeros_like(encoded["input_ids"]),
    }


def sequence_forward_inputs(
    prompt_inputs: Mapping[str, torch.Tensor],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Forward kwargs for one pass over ``[prompt, completion]`` that reproduces ``generate``.

    See the module docstring: the 3D rope positions are recomputed inside the model from
    ``mm_token_type_ids``, ``image_grid_thw`` and ``attention_mask``, so no ``position_ids``
    are passed. The logits that predict completion token ``t`` sit at sequence position
    ``P - 1 + t``: ``model(**inputs, logits_to_keep=T + 1).logits[:, :-1]`` is ``(B, T, V)``.

    Args:
        prompt_inputs: from ``vl_prompt_inputs`` or ``text_only_prompt_inputs``.
        completion_ids: ``(B, T)`` sampled tokens.
        completion_mask: ``(B, T)``, 1 on tokens that count (through the first eos).

    Returns:
        ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` ``(B, P + T)`` and, for image
        prompts, ``pixel_values`` and ``image_grid_thw`` unchanged.
    """
    prompt_ids = prompt_inputs["input_ids"]
    if completion_ids.shape != completion_mask.shape or completion_ids.shape[0] != len(prompt_ids):
        raise ValueError(
            f"completion_ids {tuple(completion_ids.shape)} and completion_mask "
            f"{tuple(completion_mask.shape)} must both be (B, T) with B = {len(prompt_ids)}"
        )
    prompt_types = prompt_inputs.get("mm_token_type_ids")
    if prompt_types is None:
        prompt_types = torch.zeros_like(prompt_ids)
    inputs = {
        "input_ids": torch.cat([prompt_ids, completion_ids], dim=1),  # (B, P+T)
        "attention_mask": torch.cat(
            [prompt_inputs["attention_mask"], completion_mask.to(prompt_ids.dtype)], dim=1
        ),  # (B, P+T)
        "mm_token_type_ids": torch.cat(
            [prompt_types, torch.zeros_like(completion_ids)], dim=1
        ),  # (B, P+T)
    }
    for key in ("pixel_values", "image_grid_thw"):
        if key in prompt_inputs:
            inputs[key] = prompt_inputs[key]
    return inputs
