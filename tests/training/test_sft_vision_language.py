"""The VL warm start: teacher-forced target batches, learning the targets, bit-identical to the
loop the supervised trainer replaced, and resumable through ``run_sft``."""

# The VL fixtures are imported from the rollout tests and requested by name as parameters.
# ruff: noqa: F811

import copy

import pytest
import torch
from transformers import get_cosine_schedule_with_warmup

from creditflow.algorithms import masked_mean
from creditflow.rollout import (
    RolloutBatch,
    SamplingSettings,
    VisionLanguagePolicy,
    as_visual_prompt,
)
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.sft import SFTConfig, run_sft, train_sft
from creditflow.training.teacher_forcing import target_batch
from tests.rollout.test_vision_policy import (  # noqa: F401 - fixtures are found by name
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)

TARGETS = ["1 + 2 = 3. The answer is \\boxed{3}"] * 2 + ["There are 4. \\boxed{4}"] * 2


def test_vl_sft_learns_the_targets(make_vl_model, vl_processor, vl_prompts):
    """Four fixed targets, 25 steps: the NLL drops well below its start, and the model is
    trained in place by train_sft while run_sft leaves its input alone."""
    config = {"steps": 25, "batch_size": 4, "learning_rate": 1e-2, "warmup_steps": 1}
    model = make_vl_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trained, history = run_sft(model, vl_processor, vl_prompts, TARGETS, config)
    assert trained is not model and all(
        torch.equal(v, before[k]) for k, v in model.state_dict().items()
    )
    losses = history["sft/loss"].tolist()
    assert len(losses) == 25 and losses[-1] < 0.5 * losses[0]
    assert not trained.training


def test_target_batch_masks_the_targets_and_respects_max_length(
    make_vl_model, vl_processor, vl_prompts
):
    policy = VisionLanguagePolicy(make_vl_model(), vl_processor, SamplingSettings())
    batch = target_batch(policy, vl_prompts[:2], [[5, 6, 2], [7, 2]])
    assert isinstance(batch, RolloutBatch)
    assert batch.completion_ids.tolist() == [[5, 6, 2], [7, 2, 0]]
    assert batch.completion_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    prompt_len = int(batch.prompt_mask[0].sum())
    cut = target_batch(policy, vl_prompts[:1], [[5, 6, 2]], max_length=prompt_len + 2)
    assert cut.completion_ids.tolist() == [[5, 6]]
    with pytest.raises(ValueError, match="raise sft max_length"):
        target_batch(policy, vl_prompts[:1], [[5, 2]], max_length=prompt_len)


# Verbatim from the VL SFT loop before the supervised trainer (the reference), with
# its helpers epoch_batches and sft_optimizer inlined.
def _old_train_vl_sft(policy, prompts, targets, config):
    tokenizer = policy.tokenizer
    eos = tokenizer.eos_token_id
    target_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in targets]
    model = policy.module
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    scheduler = get_cosine_schedule_with_warmup(
        optimizer, min(config.warmup_steps, config.steps), config.steps
    )
    history = []
    model.train()
    generator = torch.Generator().manual_seed(config.seed)
    order, cursor = torch.randperm(len(prompts), generator=generator).tolist(), 0
    for step in range(config.steps):
        rows = []
        while len(rows) < config.batch_size:
            if cursor == len(order):
                order, cursor = torch.randperm(len(prompts), generator=generator).tolist(), 0
            rows.append(order[cursor])
            cursor += 1
        batch = target_batch(
            policy,
            [prompts[i] for i in rows],
            [target_ids[i] for i in rows],
            config.max_length,
        )
        logp, _ = policy.completion_logprobs(batch)  # (b, T)
        loss = -masked_mean(logp, batch.completion_mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        history.append(
            {"step": step + 1, "sft/loss": loss.item(), "lr": scheduler.get_last_lr()[0]}
        )
    model.eval()
    return history


def test_vl_sft_is_bit_identical_to_the_loop_it_replaced(make_vl_model, vl_processor, vl_prompts):
    """4 examples in batches of 3 (the second batch straddles two epochs), clipping active."""
    config = SFTConfig(
        steps=4,
        batch_size=3,
        learning_rate=1e-2,
        warmup_steps=1,
        weight_decay=0.05,
        max_grad_norm=0.1,
        seed=2,
    )
    visual = [as_visual_prompt(p) for p in vl_prompts]
    # SFT scores on the plain forward (its rows share no prompt), as the loop it replaced did
    # when the pipeline ran it.
    plain = SamplingSettings(shared_prefix=False)
    old = VisionLanguagePolicy(make_vl_model(), vl_processor, plain)
    new = make_vl_model()
    expected = _old_train_vl_sft(old, visual, TARGETS, config)
    history = train_sft(new, vl_processor, visual, TARGETS, config, progress=False)
    assert history == expected
    a, b = new.state_dict(), old.module.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert not new.training


def test_vl_sft_resumes_an_interrupted_run(make_vl_model, vl_processor, vl_prompts, tmp_path):
    """Checkpoint at step 2 of 3, a crash in step 3, a re-run: the weights and metrics of one
    uninterrupted run; a different picture is a different run."""
    params = {"steps": 3, "batch_size": 2, "learning_rate": 1e-2, "checkpoint_every": 2}
    model = make_vl_model()
    expected, expected_metrics = run_sft(model, vl_processor, vl_prompts, TARGETS, params)

    store = CheckpointStore(tmp_path)
    calls = {"n": 0}
    original = VisionLanguagePolicy.completion_logprobs

    def crashing(self, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, batch)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VisionLanguagePolicy, "completion_logprobs", crashing)
        with pytest.raises(KeyboardInterrupt):
            run_sft(model, vl_processor, vl_prompts, TARGETS, params, store)
    (run_dir,) = tmp_path.iterdir()
    assert CheckpointStore(run_dir).latest().name == "step-000002"
    resumed, metrics = run_sft(model, vl_processor, vl_prompts, TARGETS, params, store)
    a, b = resumed.state_dict(), expected.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert metrics.equals(expected_metrics)

    flipped = copy.copy(vl_prompts)
    flipped[0] = (vl_prompts[0][0], as_visual_prompt(vl_prompts[1]).image)
    run_sft(model, vl_processor, flipped, TARGETS, params, store)
    assert len(list(tmp_path.iterdir())) == 2
