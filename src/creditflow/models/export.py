"""A trained policy taken away: its weights and its tokenizer (or processor) in one folder that
``transformers`` loads without creditflow.

The catalog keeps a comparison's policies (``<pipeline>_policies_<strategy>``, one
``seed_<seed>/`` folder each) apart from the tokenizer they were trained with
(``<pipeline>_tokenizer``, ``tor_processor``): one tokenizer serves every strategy and seed.
:func:`export_policy` writes a policy and its tokenizer side by side, with LoRA adapters
merged into the base weights by default (peft's ``merge_and_unload``), so the folder is an
ordinary checkpoint (docs/howto/export.md).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from creditflow.models.lora import is_lora_model


def export_policy(
    model: Any, tokenizer: Any, directory: str | Path, merge_lora: bool = True
) -> Path:
    """``model`` and ``tokenizer`` saved into ``directory`` (created; safetensors weights,
    config, generation config, tokenizer files and chat template). A LoRA policy is saved
    merged (``merge_lora``, the trained model itself unchanged), or as its adapters alone
    (``merge_lora=False``: peft's adapter folder, loaded over the same base checkpoint).
    Returns the folder.

    Raises:
        ValueError: ``tokenizer`` has ids past the rows of ``model``'s input embeddings, so
            it cannot be the tokenizer the model was trained with (another run's, say); the
            folder is not written.
    """
    embeddings = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embeddings:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embeddings have "
            f"{embeddings} rows: it is not the tokenizer this policy was trained with; load "
            "both at the versions of one run (integrity.run_versions of its manifest)"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if is_lora_model(model) and merge_lora:
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
