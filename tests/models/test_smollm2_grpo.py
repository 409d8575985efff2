"""Two GRPO steps on the real SmolLM2-135M-Instruct checkpoint (``creditflow fetch-model
smollm2-135m-instruct``), with the rewards of the smollm2 bench (conf/smollm2); skipped until
the checkpoint is fetched."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from creditflow import api
from creditflow.tasks.prompts import generate_prompt_tasks, reward_dataset

NAME = "smollm2-135m-instruct"
CHECKPOINT = Path(__file__).resolve().parents[2] / "data/06_models/pretrained" / NAME

pytestmark = pytest.mark.skipif(
    not (CHECKPOINT / "model.safetensors").is_file(),
    reason=f"the real checkpoint is not fetched: creditflow fetch-model {NAME} (or make model)",
)


def test_two_grpo_steps_on_the_real_checkpoint_change_its_weights():
    model, tokenizer = api.build_policy(str(CHECKPOINT))
    assert type(model).__name__ == "LlamaForCausalLM"
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    prompts = reward_dataset(generate_prompt_tasks(2, ["max"], max_operand=99, seed=0))
    config = api.grpo_config(
        steps=2,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=16,
        learning_rate=3e-5,
        checkpoint_every=0,
        rewards={"final_number": 1.0, "number_format": 1.0},
    )
    torch.manual_seed(0)
    trained = api.train_grpo(model, tokenizer, prompts, ["final_number", "number_format"], config)
    assert trained.metrics["step"].tolist() == [1, 2]
    assert pd.Series(trained.metrics["reward/total"]).between(0.0, 2.0).all()
    # The completions are the checkpoint's own words, decoded with its tokenizer.
    assert trained.samples["completion"].str.len().gt(0).any()
    changed = [
        n for n, p in trained.model.named_parameters() if not torch.equal(p.detach(), before[n])
    ]
    assert changed, "no weight changed in two GRPO steps"
