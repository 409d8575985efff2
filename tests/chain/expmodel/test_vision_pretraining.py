"""The ExpModel's self-supervised vision pre-training: the degradations it draws are the ones it
applies, the tower learns to regress them (the loss falls well below a constant guess's), only
the vision tower changes, and its settings are checked."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from creditflow.chain.config import VisionPretraining
from creditflow.chain.expmodel.vision_pretraining import (
    degrade,
    draw_amounts,
    pretrain_vision_tower,
)
from creditflow.chain.world.catalogue import generate_catalogue
from creditflow.models import build_tiny_processor, build_tiny_qwen2_5_vl, train_vl_tokenizer
from tests.chain.expmodel.test_expmodel import TINY_VL

IMAGE_SIZE = 56


def test_degrade_applies_the_amounts_it_is_given():
    rng = np.random.default_rng(0)
    stripes = np.zeros((32, 32, 3), dtype=np.uint8)
    stripes[:, ::2] = 200
    image = Image.fromarray(stripes)
    same = np.asarray(degrade(image, (0.0, 0.0, 0.0), rng))
    assert np.array_equal(same, stripes)
    blurred = np.asarray(degrade(image, (2.0, 0.0, 0.0), rng)).astype(float)
    assert blurred.std() < 0.5 * stripes.std()  # the stripes are washed out
    darker = np.asarray(degrade(image, (0.0, np.log(0.5), 0.0), rng)).astype(float)
    assert darker.max() == pytest.approx(100, abs=1)
    noisy = np.asarray(degrade(image, (0.0, 0.0, 10.0), rng)).astype(float)
    assert (noisy - stripes).std() == pytest.approx(10.0, rel=0.2)
    amounts = draw_amounts(VisionPretraining(max_log_gain=0.3), 500, rng)
    assert (amounts[:, 0] >= 0).all() and (amounts[:, 0] <= 4.0).all()
    assert (np.abs(amounts[:, 1]) <= 0.3).all() and (amounts[:, 2] <= 12.0).all()


def test_the_tower_learns_to_see_the_degradations_and_nothing_else_moves():
    covers = generate_catalogue(24, seed=5, image_size=IMAGE_SIZE)
    texts = list(covers["title"]) * 4
    processor = build_tiny_processor(train_vl_tokenizer(texts, vocab_size=400), IMAGE_SIZE)
    model = build_tiny_qwen2_5_vl(processor, seed=0, **TINY_VL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    settings = VisionPretraining(steps=150, batch_size=16, learning_rate=3e-3, seed=3)
    torch.manual_seed(0)
    model, history = pretrain_vision_tower(
        model, processor.image_processor, list(covers["image_png"]), settings
    )
    losses = [row["vision/loss"] for row in history]
    assert len(losses) == 150
    # A constant guess of the middle scores about 1/3 on the three scaled amounts (uniform on
    # [0, 1] or [-1, 1]); the tower does much better by the end.
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:5])
    assert np.mean(losses[-20:]) < 0.12
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(".visual." in k or k.startswith("model.visual") for k in changed)


def test_settings_are_checked_and_a_model_without_a_tower_is_refused():
    with pytest.raises(ValueError, match="steps"):
        VisionPretraining(steps=-1)
    with pytest.raises(ValueError, match="max_noise_std"):
        VisionPretraining(max_noise_std=0.0)
    png = io.BytesIO()
    Image.new("RGB", (28, 28)).save(png, format="PNG")
    with pytest.raises(ValueError, match="no vision tower"):
        pretrain_vision_tower(torch.nn.Linear(2, 2), None, [png.getvalue()], VisionPretraining())
