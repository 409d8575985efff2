"""The ExpModel scorer of docs/methods/experience.md, step 3: a vision-language backbone with a scalar head.

PFT "replaces the LM head by a scalar head s": the SFT'd generator's inner model (for
Qwen2.5-VL, ``Qwen2_5_VLForConditionalGeneration.model``: ViT, merger, embeddings and decoder,
no LM head) reads the item prompt, and ``nn.Linear(H, 1)`` maps the hidden state of the last
real token to the experience score. The last token is the one a causal model has read the
whole prompt (image tokens included) by, and the one whose state the LM head would turn into
the first answer token, so the scorer starts from what SFT taught it to summarise.

Shape symbols: ``B`` sequences (items), ``P`` prompt tokens, ``H`` hidden width.

On-disk layout of ``save_pretrained(directory)``::

    directory/backbone/         the backbone's own save_pretrained (config.json, safetensors)
    directory/head.safetensors  the head's "weight" (1, H) and "bias" (1,), float32
    directory/scorer_config.json
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

logger = logging.getLogger(__name__)

BACKBONE_DIRECTORY = "backbone"
HEAD_FILE = "head.safetensors"
CONFIG_FILE = "scorer_config.json"
FORMAT_VERSION = 1


class ExpScorer(nn.Module):
    """Scalar experience score ``s`` of an item from its prompt (cover image + title).

    The head starts at zero, so an untrained scorer gives every item 0: every pair is a tie,
    the PFT loss starts at ``log 2`` and the centring term of docs/methods/experience.md, step 3 at 0.

    Args:
        backbone: a model whose forward returns ``last_hidden_state`` ``(B, P, H)``, e.g.
            ``vl_model.model`` of a ``Qwen2_5_VLForConditionalGeneration`` (see
            ``from_generator``). It is used as is, not copied.
    """

    def __init__(self, backbone: PreTrainedModel):
        super().__init__()
        self.backbone = backbone
        hidden_size = backbone.config.get_text_config().hidden_size
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_generator(cls, model: PreTrainedModel) -> ExpScorer:
        """Wrap the inner model of a generator (the SFT'd ExpModel), dropping its LM head.

        The scorer *shares* the generator's backbone parameters: PFT then changes the
        generator too. Deep-copy the generator first to keep it (a Kedro pipeline saves the
        SFT checkpoint before PFT, so it does not need to).
        """
        backbone = model.base_model
        if backbone is model:
            raise ValueError(
                f"{type(model).__name__} has no inner base model (base_model_prefix "
                f"{model.base_model_prefix!r}); pass a *ForConditionalGeneration / *ForCausalLM model"
            )
        return cls(backbone)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **inputs: Any
    ) -> torch.Tensor:
        """Scores of ``B`` prompts.

        Args:
            input_ids: ``(B, P)`` prompt tokens, padded on either side.
            attention_mask: ``(B, P)``, 1 on real tokens. The pooled token of each row is the
                last one with mask 1, so left padding (``vl_prompt_inputs``) and right padding
                give the same score.
            **inputs: the rest of the model inputs, passed on unchanged: for Qwen2.5-VL
                ``mm_token_type_ids`` ``(B, P)``, ``pixel_values`` and ``image_grid_thw``
                (see ``creditflow.models.vision``: no ``position_ids``, so the 3D rope
                positions are derived from ``mm_token_type_ids``).

        Returns:
            ``(B,)`` float32 scores.
        """
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **inputs
        ).last_hidden_state  # (B, P, H)
        last = last_token_index(attention_mask)  # (B,)
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, H)
        return self.head(pooled.to(self.head.weight.dtype)).squeeze(-1)  # (B,)

    def parameters_to_train(self, train_backbone: bool) -> list[nn.Parameter]:
        """All parameters, or (``train_backbone=False``) the head, the last decoder layer and
        the final norm: the cheap option, as the vision tower and embeddings then need no
        gradients. The second needs a backbone with ``language_model.layers`` and
        ``language_model.norm`` (Qwen2.5-VL's)."""
        if train_backbone:
            return list(self.parameters())
        decoder = getattr(self.backbone, "language_model", None)
        if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
            raise ValueError(
                f"train_backbone=False needs backbone.language_model.layers and .norm; "
                f"{type(self.backbone).__name__} has none: set train_backbone=True"
            )
        return [
            *self.head.parameters(),
            *decoder.layers[-1].parameters(),
            *decoder.norm.parameters(),
        ]

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write the backbone, the head and ``scorer_config.json`` to ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(directory / BACKBONE_DIRECTORY)
        save_file(
            {
                "weight": self.head.weight.detach().float().cpu().contiguous(),
                "bias": self.head.bias.detach().float().cpu().contiguous(),
            },
            str(directory / HEAD_FILE),
        )
        config = {
            "format_version": FORMAT_VERSION,
            "hidden_size": self.head.in_features,
            # from_pretrained would otherwise pick sdpa; padded rows then differ by float
            # rounding from a model trained with eager attention.
            "attn_implementation": self.backbone.config._attn_implementation,
        }
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        logger.info("saved ExpScorer to %s", directory)
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, **backbone_kwargs: Any) -> ExpScorer:
        """Load a scorer written by ``save_pretrained``, in eval mode.

        Args:
            directory: the saved directory.
            **backbone_kwargs: passed to ``AutoModel.from_pretrained`` for the backbone (e.g.
                ``dtype``); ``attn_implementation`` defaults to the saved one.
        """
        directory = Path(directory)
        config_path = directory / CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(
                f"{config_path} not found: not a directory written by ExpScorer.save_pretrained"
            )
        config = json.loads(config_path.read_text())
        if config.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"unsupported scorer format_version {config.get('format_version')!r} in "
                f"{config_path}; this code reads version {FORMAT_VERSION}"
            )
        backbone_kwargs.setdefault("attn_implementation", config["attn_implementation"])
        backbone = AutoModel.from_pretrained(directory / BACKBONE_DIRECTORY, **backbone_kwargs)
        scorer = cls(backbone)
        if scorer.head.in_features != config["hidden_size"]:
            raise ValueError(
                f"backbone hidden size {scorer.head.in_features} does not match the saved head's "
                f"{config['hidden_size']} in {directory}"
            )
        head = load_file(str(directory / HEAD_FILE))
        scorer.head.load_state_dict(head)
        return scorer.eval()


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` position of the last real token (mask 1) of each ``(B, P)`` row, any padding side.

    >>> last_token_index(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]])).tolist()
    [3, 2]
    """
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must have shape (B, P), got {tuple(attention_mask.shape)}"
        )
    if not bool(attention_mask.bool().any(dim=1).all()):
        raise ValueError("every row of attention_mask needs at least one real token (mask 1)")
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (P,)
    return (attention_mask.bool().long() * positions).argmax(dim=1)  # (B,)
