"""Each annotator's keyword options, checked without building its backend: what the parameter
check (``pipelines.chain_parameters``) reads before torch loads.

``ANNOTATOR_OPTIONS`` maps every name of ``annotation.base.ANNOTATORS`` to a callable that
takes the same keyword options and runs the annotator's own checks. The heuristic and openai
annotators are their own: building one loads and sends nothing, and their modules import no
torch. The hf annotator's module imports torch and transformers, so its options are
:class:`HFOptions`, which ``HFAnnotator`` runs its checks through (a test holds the two
signatures equal).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from types import MappingProxyType
from typing import Any

from creditflow.chain.annotation.cache import DEFAULT_CACHE_DIR
from creditflow.chain.annotation.heuristic import HeuristicAnnotator
from creditflow.chain.annotation.openai_backend import DEFAULT_PROMPT_TEMPLATE, OpenAIAnnotator


@dataclass(frozen=True)
class HFOptions:
    """The options of ``annotation.hf_backend.HFAnnotator``, whose docstring says what each is,
    and its checks: exactly one model source, a passed model with its processor, positive
    budgets and temperature, a prompt template with only the ``{title}``, ``{category}`` and
    ``{schema}`` placeholders.

    Raises:
        ValueError: saying which option to fix.
    """

    model_name_or_path: str | os.PathLike | None = None
    spec: Mapping[str, Any] | None = None
    max_new_tokens: int = 256
    batch_size: int = 4
    max_retries: int = 1
    seed: int = 0
    model: Any = None
    processor: Any = None
    _: KW_ONLY
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    retry_temperature: float = 1.0
    device: str | None = None
    progress: bool = True
    cache_dir: str | os.PathLike | None = DEFAULT_CACHE_DIR

    def __post_init__(self) -> None:
        sources = [
            name
            for name, value in (
                ("model_name_or_path", self.model_name_or_path),
                ("spec", self.spec),
                ("model", self.model),
            )
            if value is not None
        ]
        if len(sources) != 1:
            raise ValueError(
                "give exactly one model source: model_name_or_path (hub id or directory), spec "
                f"(a load_policy dict) or model with processor; got {sources or 'none'}"
            )
        if self.model is not None and self.processor is None:
            raise ValueError(
                "a passed model needs its processor: HFAnnotator(model=..., processor=...)"
            )
        if self.spec is not None and not isinstance(self.spec, Mapping):
            raise ValueError(f"spec must be a load_policy dict, got {type(self.spec).__name__}")
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.max_retries < 0:
            raise ValueError(
                "need max_new_tokens >= 1, batch_size >= 1 and max_retries >= 0, got "
                f"{self.max_new_tokens}, {self.batch_size}, {self.max_retries}"
            )
        if not self.retry_temperature > 0:
            raise ValueError(f"retry_temperature must be > 0, got {self.retry_temperature}")
        try:
            self.prompt_template.format(title="", category="", schema="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                "prompt_template may only use the placeholders {title}, {category} and {schema} "
                f"(double other braces): {exc!r}"
            ) from exc


# The annotators by name, each as what checks its options (module docstring).
ANNOTATOR_OPTIONS: Mapping[str, Callable[..., object]] = MappingProxyType(
    {"heuristic": HeuristicAnnotator, "hf": HFOptions, "openai": OpenAIAnnotator}
)
