"""Task generators: seeded problem sets in the project's data schemas (no Kedro, no I/O)."""

from creditflow.tasks.tapo import (
    ALL_LANGUAGES,
    DEFAULT_LANGUAGES,
    DEFAULT_NUMBER_STYLE_PROBS,
    TAPO_COLUMNS,
    TAPO_INSTRUCTION,
    format_tapo_target,
    generate_tapo_problems,
    split_by_language,
    tapo_prompt,
)

__all__ = [
    "ALL_LANGUAGES",
    "DEFAULT_LANGUAGES",
    "DEFAULT_NUMBER_STYLE_PROBS",
    "TAPO_COLUMNS",
    "TAPO_INSTRUCTION",
    "format_tapo_target",
    "generate_tapo_problems",
    "split_by_language",
    "tapo_prompt",
]
