"""Policy specs without torch: the ``policy`` block of a parameter group
(:class:`PolicySpec`, its ``lora`` block :class:`LoraSpec`, the tiny models' options), checked
before torch loads (``hooks.parameter_check``). ``models.builders`` and ``models.vision``
build or load what a spec describes; ``models.lora`` adds its adapters.
"""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

# Both run the same speed for the tiny model on CPU and both are deterministic there
# (measured: identical logits across runs and across batch compositions). "eager" is the
# default because it is plain matmul + softmax with no shape-dependent kernel choice and it
# is the only one that can return attention maps; pass "sdpa" for real models on GPU.
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
# The dtype names of models.builders.DTYPES ("auto": whatever the checkpoint's config.json
# says); a test holds the two equal.
DTYPE_NAMES = ("float32", "bfloat16", "float16", "auto")
LORA_KEYS = ("r", "alpha", "target_modules", "dropout", "seed")
ALL_LINEAR = "all-linear"  # peft's shorthand (peft.utils.constants.INCLUDE_LINEAR_LAYERS_SHORTHAND)
TEXT_EXAMPLE_ID = "Qwen/Qwen2.5-0.5B-Instruct"
VL_EXAMPLE_ID = "Qwen/Qwen2.5-VL-3B-Instruct"


@dataclass(frozen=True)
class TinyQwen2:
    """The keyword options of ``models.builders.build_tiny_qwen2`` (a test holds them equal to
    its signature), the ``tiny`` block of a text policy.

    hidden_size: must be divisible by ``num_attention_heads``.
    num_attention_heads: must be divisible by ``num_key_value_heads`` (GQA groups).
    seed: weights depend only on it; the global torch RNG is left untouched.
    attn_implementation: one of ``ATTN_IMPLEMENTATIONS``.
    """

    # the checkpoint a "pretrained" spec's error message suggests
    example_id: ClassVar[str] = TEXT_EXAMPLE_ID
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    seed: int = 0
    tie_word_embeddings: bool = True
    attn_implementation: str = "eager"


@dataclass(frozen=True)
class TinyQwen2_5VL:
    """The keyword options of ``models.vision.build_tiny_qwen2_5_vl`` (a test holds them equal
    to its signature), the ``tiny`` block of a vision-language policy.

    hidden_size: text width, also the ViT merger's output width (``out_hidden_size``).
    vision_hidden_size: must be divisible by ``vision_num_heads``, and the ViT head
        width by 4 (its axial rope splits it over h and w).
    seed: weights depend only on it; the global torch RNG is left untouched.
    attn_implementation: one of ``ATTN_IMPLEMENTATIONS`` (text and vision).
    """

    example_id: ClassVar[str] = VL_EXAMPLE_ID
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_num_heads: int = 2
    vision_intermediate_size: int = 64
    seed: int = 0
    tie_word_embeddings: bool = True
    attn_implementation: str = "eager"


@dataclass(frozen=True)
class LoraSpec:
    """The ``lora`` block of a policy spec; only ``r`` is required::

        lora: {r: 16}       # alpha 32, every linear layer but the output head
        lora: {r: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj], dropout: 0.05}

    r: rank of each adapter (>= 1).
    alpha: peft's ``lora_alpha``; the adapter's output is scaled by ``alpha / r``. Default
        (null): ``2 * r``, a scale of 2 whatever the rank (peft's own default is a fixed 8).
    target_modules: the modules that get an adapter, as peft matches them. Default
        ``"all-linear"`` (peft's shorthand): every ``nn.Linear`` except the output head (kept
        out, so a head tied to the embeddings stays tied). A list of module names (a name
        matches every module whose path ends with it, e.g. ``q_proj``); or one string, a regular
        expression the full module path must match, e.g. ``'.*\\.(q_proj|v_proj)'``: the form
        for ``--params``, which splits its argument at commas and so cannot pass a list. In a
        vision-language model ``"all-linear"`` and a list name also reach the vision tower's
        modules; a regex such as ``'model\\.language_model\\..*\\.(q_proj|v_proj)'`` keeps to
        the language model.
    dropout: dropout on the adapter's input while training, in [0, 1).
    seed: the adapters' initial weights depend only on it (the global RNG is left as it was).
    """

    r: int
    alpha: float | None = None
    target_modules: tuple[str, ...] | str = ALL_LINEAR
    dropout: float = 0.0
    seed: int = 0

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> LoraSpec:
        """Validate a ``lora`` block before anything is built.

        Raises:
            ValueError: naming the key and what to set.
        """
        if not isinstance(params, Mapping):
            raise ValueError(
                f"lora must be a mapping {{r, alpha, target_modules, dropout, seed}} or null, got "
                f"{params!r}"
            )
        unknown = sorted(set(params) - set(LORA_KEYS))
        if unknown:
            raise ValueError(f"unknown lora keys {unknown}; valid: {list(LORA_KEYS)}")
        if "r" not in params:
            raise ValueError("lora needs its rank r (e.g. lora: {r: 16}), or set lora to null")
        defaults = {f.name: f.default for f in fields(cls) if f.name != "r"}
        r, alpha, target_modules, dropout, seed = (
            params.get(key, defaults.get(key)) for key in LORA_KEYS
        )
        if not _is_int(r) or r < 1:
            raise ValueError(f"lora r must be an integer >= 1, got {r!r}")
        alpha = 2 * r if alpha is None else alpha
        if not _is_number(alpha) or not alpha > 0:
            raise ValueError(f"lora alpha must be a number > 0, got {alpha!r}")
        if not _is_number(dropout) or not 0 <= dropout < 1:
            raise ValueError(f"lora dropout must be in [0, 1), got {dropout!r}")
        if not _is_int(seed):
            raise ValueError(f"lora seed must be an integer, got {seed!r}")
        return cls(
            r=int(r),
            alpha=float(alpha),
            target_modules=_target_modules(target_modules),
            dropout=float(dropout),
            seed=int(seed),
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _target_modules(value: Any) -> tuple[str, ...] | str:
    if isinstance(value, str) and value:
        return value
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(name, str) and name for name in value)
    ):
        return tuple(value)
    raise ValueError(
        "lora target_modules must be a non-empty list of module names (e.g. [q_proj, v_proj]) "
        f"or one regular expression / 'all-linear', got {value!r}"
    )


# Keys a spec may hold besides its ``tiny`` builder options, per source.
_COMMON_KEYS = {"source", "dtype", "device", "lora"}
_SOURCE_KEYS = {
    "tiny": {"tiny"},
    "pretrained": {"name_or_path", "trust_remote_code", "attn_implementation"},
}
_SPEC_KEYS = {source: _COMMON_KEYS | keys for source, keys in _SOURCE_KEYS.items()}
DEVICE_TYPES = ("cpu", "cuda", "mps")


def without_other_source(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` less the keys only the other policy sources take: ``tiny`` beside ``source:
    pretrained``; ``name_or_path``, ``trust_remote_code``, ``attn_implementation`` beside
    ``source: tiny``. Nothing is dropped when ``source`` names no source.

    The project merges conf/local into conf/base key by key (settings.py), so base's ``tiny:``
    block is still there when an override switches ``source`` to ``pretrained``: it is
    ignored, not refused.
    """
    source = spec.get("source")
    if source not in _SOURCE_KEYS:
        return dict(spec)
    other = set().union(*(keys for name, keys in _SOURCE_KEYS.items() if name != source))
    return {key: value for key, value in spec.items() if key not in other}


_DEVICE_NAME = re.compile(r"(cpu|cuda|mps)(:[0-9]+)?")


def check_device_name(name: Any) -> str:
    """``name`` if it is a device name a policy spec may hold (``"auto"``, ``"cpu"``,
    ``"cuda"``, ``"cuda:<index>"``, ``"mps"``), else a ValueError listing them. Whether this
    machine has the device is ``models.builders.resolve_device``'s check (it needs torch).
    """
    if name == "auto" or (isinstance(name, str) and _DEVICE_NAME.fullmatch(name)):
        return name
    raise ValueError(
        f"unknown device {name!r}; valid: 'auto', 'cpu', 'cuda', 'cuda:<index>', 'mps'"
    )


@dataclass(frozen=True)
class PolicySpec:
    """A validated policy spec, the ``params:`` dict of ``models.load_policy``::

        {"source": "tiny", "tiny": {...kwargs of the tiny builder...}}
        {"source": "pretrained",
         "name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",   # hub id or local directory
         "dtype": "bfloat16",                            # optional, default "auto"
         "device": "cuda",                               # optional, default "cpu"
         "lora": {"r": 16},                              # optional, default None
         "trust_remote_code": False,                     # optional
         "attn_implementation": "sdpa"}                  # optional

    source: ``"tiny"`` (a randomly initialised model built here) or ``"pretrained"``. The
        keys of the other source (``tiny`` beside ``pretrained``; ``name_or_path``,
        ``trust_remote_code``, ``attn_implementation`` beside ``tiny``) are ignored, so an
        override that switches ``source`` need not remove them.
    tiny: keyword arguments of the tiny builder (``source: tiny`` only).
    name_or_path: hub id or local checkpoint directory (``source: pretrained`` only).
    dtype: a ``DTYPE_NAMES`` name; ``"auto"`` keeps the checkpoint's (float32 for a tiny
        model).
    device: where the policy lives, a ``check_device_name`` name (``"auto"``: CUDA when
        present); one this machine lacks fails the spec (``models.builders.resolve_device``).
        The catalog loads saved policies on the CPU, so the nodes that take one move it there
        (``models.builders.to_policy_device``).
    lora: a ``LoraSpec`` block: train LoRA adapters (peft, an optional extra) on
        the frozen model instead of all of its weights; None trains them all.
    trust_remote_code: whether ``from_pretrained`` may run code shipped with the checkpoint.
    attn_implementation: one of ``ATTN_IMPLEMENTATIONS``, or None for transformers' default.
    """

    source: str
    tiny: Mapping[str, Any] = field(default_factory=dict)
    name_or_path: str | None = None
    dtype: str = "auto"
    device: str = "cpu"
    lora: LoraSpec | None = None
    trust_remote_code: bool = False
    attn_implementation: str | None = None

    @classmethod
    def from_params(
        cls,
        spec: Mapping[str, Any],
        *,
        tiny_options: Collection[str],
        example_id: str,
        check_device: Callable[[str], Any] = check_device_name,
    ) -> PolicySpec:
        """Validate ``spec`` before anything is built or loaded.

        Args:
            spec: a dict of the form above.
            tiny_options: the keyword arguments the tiny builder takes.
            example_id: a hub id for the message when ``name_or_path`` is missing.
            check_device: raises ValueError for a ``device`` that cannot be used: by default
                the name's form only; ``models.builders.resolve_device`` also asks whether this
                machine has it (torch), as loading a policy and the check before a run's first
                node do.

        Raises:
            ValueError: an invalid spec, with what to set in ``parameters_*.yml``.
        """
        source = spec.get("source")
        if source not in _SPEC_KEYS:
            raise ValueError(f"unknown policy source {source!r}; valid: {sorted(_SPEC_KEYS)}")
        spec = without_other_source(spec)
        unknown = set(spec) - _SPEC_KEYS[source]
        if unknown:
            raise ValueError(
                f"unknown keys {sorted(unknown)} for policy source {source!r}; "
                f"valid: {sorted(_SPEC_KEYS[source])}"
            )
        dtype = spec.get("dtype", "auto")
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r}; valid: {list(DTYPE_NAMES)}")
        device = spec.get("device", "cpu")
        check_device(device)
        lora = None if spec.get("lora") is None else LoraSpec.from_params(spec["lora"])
        common = {"dtype": dtype, "device": device, "lora": lora}
        if source == "tiny":
            tiny = dict(spec.get("tiny") or {})
            unknown = set(tiny) - set(tiny_options)
            if unknown:
                raise ValueError(
                    f"unknown keys {sorted(unknown)} under 'tiny'; valid: {sorted(tiny_options)}"
                )
            return cls(source="tiny", tiny=tiny, **common)
        name_or_path = spec.get("name_or_path")
        if not name_or_path:
            raise ValueError(
                "policy source 'pretrained' needs 'name_or_path': set it in parameters to a "
                f"Hugging Face id (e.g. '{example_id}') or a local checkpoint directory"
            )
        attn = spec.get("attn_implementation")
        if attn is not None and attn not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"unknown attn_implementation {attn!r}; valid: {list(ATTN_IMPLEMENTATIONS)}"
            )
        trust_remote_code = spec.get("trust_remote_code", False)
        if not isinstance(trust_remote_code, bool):
            # A YAML string such as "false" would be truthy and silently run hub code.
            raise ValueError(f"trust_remote_code must be true or false, got {trust_remote_code!r}")
        return cls(
            source="pretrained",
            name_or_path=os.fspath(name_or_path),
            trust_remote_code=trust_remote_code,
            attn_implementation=attn,
            **common,
        )


def checked_policy_spec(
    spec: Mapping[str, Any],
    tiny: type[TinyQwen2] | type[TinyQwen2_5VL],
    check_device: Callable[[str], Any] = check_device_name,
) -> PolicySpec:
    """``spec`` validated as the loader of ``tiny``'s kind takes it (``TinyQwen2``:
    ``models.load_policy``'s text kind; ``TinyQwen2_5VL``: its vision-language kind),
    with ``tiny``'s fields as the options of its ``tiny`` block, building nothing: the check
    a run makes before its first node."""
    return PolicySpec.from_params(
        spec,
        tiny_options=_field_names(tiny),
        example_id=tiny.example_id,
        check_device=check_device,
    )


def _field_names(cls: type) -> set[str]:
    return {item.name for item in fields(cls)}
