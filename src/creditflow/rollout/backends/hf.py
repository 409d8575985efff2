"""The ``hf`` rollout backend: ``transformers``' ``model.generate`` on the trained module."""

from __future__ import annotations

from typing import ClassVar

import torch
from transformers import GenerationConfig

from creditflow.rollout.backends.base import (
    Generation,
    GenerationRequest,
    completion_mask_from_eos,
    finish_reasons,
)


class HFBackend:
    """Samples with ``module.generate``: every prompt row repeated G times, one batch.

    Works for every ``transformers`` generative model (the vision-language policy passes its
    image inputs through ``model_inputs``); the reference the other backends are checked
    against.
    """

    name: ClassVar[str] = "hf"
    samples_module: ClassVar[bool] = True

    @torch.no_grad()
    def generate(
        self,
        module: torch.nn.Module,
        request: GenerationRequest,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> Generation:
        """``model_inputs``: further per-row inputs of ``generate`` (already G rows per
        prompt, e.g. a vision-language model's pixels); the ids and mask come from
        ``request``."""
        G = request.group_size
        prompt_ids = request.prompt_ids.repeat_interleave(G, dim=0)  # (B, P)
        prompt_mask = request.prompt_mask.repeat_interleave(G, dim=0)  # (B, P)
        if request.do_sample:
            options = {
                "do_sample": True,
                "temperature": request.temperature,
                "top_p": request.top_p,
                "top_k": request.top_k,
            }
        else:
            options = {"do_sample": False}
        if request.suppressed_ids:
            options["suppress_tokens"] = list(request.suppressed_ids)
        # generate() fills every option a call leaves unset from the checkpoint's
        # generation_config (Qwen2.5-Instruct ships repetition_penalty=1.05); those would sample
        # from another distribution than the one the policy scores, so the call sees an empty
        # one and only the options above.
        saved_config = module.generation_config
        module.generation_config = GenerationConfig()
        try:
            output = module.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                max_new_tokens=request.max_new_tokens,
                pad_token_id=request.pad_id,
                eos_token_id=list(request.stop_ids),
                **(model_inputs or {}),
                **options,
            )
        finally:
            module.generation_config = saved_config
        completion_ids = output[:, prompt_ids.shape[1] :]  # (B, T)
        mask = completion_mask_from_eos(completion_ids, list(request.stop_ids))  # (B, T)
        completion_ids = completion_ids.masked_fill(mask == 0, request.pad_id)
        return Generation(
            completion_ids=completion_ids,
            finish_reasons=finish_reasons(completion_ids, list(request.stop_ids)),
            weights_version=request.weights_version,
        )

    def load_weights(self, module: torch.nn.Module, version: int) -> None:
        """Nothing to copy: ``generate`` runs the trained module itself."""
