"""Self-supervised pre-training of the ExpModel's vision tower on covers nobody annotated
(docs/methods/experience.md, step 2).

The ExpModel must judge a cover's sharpness, exposure and pixel noise from its pixels; SFT on a
few hundred annotated covers teaches it brightness and little else. Before SFT, this teaches
the vision tower to see those three: each step takes covers of a catalogue the chain does not
use (rendered with another seed; only its ``image_png`` column is read), degrades each by a
known random amount (a Gaussian blur, a brightness gain, additive pixel noise) and trains the
tower, with a linear head on its mean image token, to regress the three amounts it applied.
The targets are the degradations this module drew, never the world's hidden quality: a
pretext task in the manner of rotation or augmentation prediction. The head is dropped; SFT
starts from the pre-trained tower.

Shape symbols: ``B`` covers per step, ``T`` image tokens per cover, ``D`` their width.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFilter

from creditflow.chain.config import VisionPretraining
from creditflow.config.supervised import SupervisedConfig
from creditflow.training.checkpoint import CheckpointStore, content_digest, run_store
from creditflow.training.supervised import SupervisedTrainer

logger = logging.getLogger(__name__)

# The three regressed amounts, in head order.
DEGRADATIONS = ("blur_radius", "log_gain", "noise_std")


def degrade(image: Image.Image, amounts: Sequence[float], rng: np.random.Generator) -> Image.Image:
    """``image`` blurred by ``amounts[0]`` (Gaussian radius), scaled in brightness by
    ``exp(amounts[1])`` and given Gaussian pixel noise of std ``amounts[2]``, in that order
    (the order the world renders its covers in)."""
    blur_radius, log_gain, noise_std = (float(a) for a in amounts)
    out = image.filter(ImageFilter.GaussianBlur(blur_radius)) if blur_radius > 0 else image
    pixels = np.asarray(out, dtype=np.float64) * math.exp(log_gain)
    pixels = pixels + rng.normal(0.0, noise_std, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).round().astype(np.uint8))


def draw_amounts(settings: VisionPretraining, count: int, rng: np.random.Generator) -> np.ndarray:
    """``(count, 3)`` degradations drawn uniformly over their ranges (``DEGRADATIONS`` order)."""
    return np.stack(
        [
            rng.uniform(0.0, settings.max_blur_radius, count),
            rng.uniform(-settings.max_log_gain, settings.max_log_gain, count),
            rng.uniform(0.0, settings.max_noise_std, count),
        ],
        axis=1,
    )


def image_tokens(visual: torch.nn.Module, image_processor: Any, images: list[Image.Image]):
    """``(B, T, D)`` the vision tower's merged image tokens of ``images`` (every image of one
    size, so each has the same ``T``)."""
    inputs = image_processor(images=images, return_tensors="pt")
    out = visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
    tokens = out.pooler_output if hasattr(out, "pooler_output") else out  # (B * T, D)
    return tokens.reshape(len(images), -1, tokens.shape[-1])


class _TowerWithHead(torch.nn.Module):
    """The vision tower and the pretext head, trained (and checkpointed) together."""

    def __init__(self, visual: torch.nn.Module, width: int):
        super().__init__()
        self.visual = visual
        self.head = torch.nn.Linear(width, len(DEGRADATIONS))


def pretrain_vision_tower(
    model: torch.nn.Module,
    image_processor: Any,
    covers: Sequence[bytes],
    settings: VisionPretraining,
    checkpoints: CheckpointStore | None = None,
) -> tuple[torch.nn.Module, list[dict[str, float]]]:
    """Train ``model``'s vision tower (``model.model.visual``) in place to regress the
    degradations of ``covers`` (PNG bytes) through the supervised trainer
    (``settings.steps`` AdamW steps at a constant rate; ``checkpoints``: a store for this run
    to resume from, None saves nothing); returns the model and one metrics row per step
    (``vision/loss``: the mean squared error of the three amounts over their ranges, about 1/3
    for a tower that always predicts the middle). A batch's degradations are drawn from its
    rows and ``settings.seed``, so a resumed run draws what it would have.

    Raises:
        ValueError: no covers, or a model without a vision tower.
    """
    visual = getattr(getattr(model, "model", None), "visual", None)
    if visual is None:
        raise ValueError(f"{type(model).__name__} has no vision tower (model.visual)")
    if not covers:
        raise ValueError("vision pre-training needs at least one cover")
    images = [Image.open(io.BytesIO(png)).convert("RGB") for png in covers]
    torch.manual_seed(settings.seed)
    width = image_tokens(visual, image_processor, images[:1]).shape[-1]
    module = _TowerWithHead(visual, width)
    scales = torch.tensor(settings.scales)

    def batch_fn(rows: list[int]) -> tuple[list[Image.Image], torch.Tensor]:
        rng = np.random.default_rng([settings.seed, *rows])
        amounts = draw_amounts(settings, len(rows), rng)  # (B, 3)
        batch = [degrade(images[i], a, rng) for i, a in zip(rows, amounts, strict=True)]
        return batch, torch.from_numpy(amounts).float() / scales  # targets in [-1, 1]

    def loss_fn(batch: tuple[list[Image.Image], torch.Tensor]) -> tuple[torch.Tensor, dict]:
        pictures, target = batch
        pooled = image_tokens(module.visual, image_processor, pictures).float().mean(dim=1)
        loss = torch.nn.functional.mse_loss(module.head(pooled), target)  # (B, D) -> scalar
        return loss, {"vision/loss": loss.item()}

    training = SupervisedConfig(
        steps=settings.steps,
        batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        seed=settings.seed,
        schedule="constant",
    )
    store = run_store(
        checkpoints, module, training.run_key(), [[content_digest(png) for png in covers]]
    )
    history = SupervisedTrainer(
        module, len(images), batch_fn, loss_fn, training, store, desc="ExpModel vision"
    ).train()
    visual.eval()
    if history:
        logger.info(
            "vision pre-training: loss %.4f -> %.4f over %d steps",
            history[0]["vision/loss"],
            history[-1]["vision/loss"],
            len(history),
        )
    return model, history
