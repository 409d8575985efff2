"""DAPO's batch-side techniques in the GRPO loop (training.dapo): dynamic sampling on
hand-built batches, reward shaping and truncation masking, and the trainer with them on a tiny
language policy and on the vision-language policy (ToR)."""

# The VL fixtures are imported from the rollout tests and requested by name as parameters.
# ruff: noqa: F811

import copy

import pytest
import torch

from creditflow.config.grpo import DynamicSampling
from creditflow.rollout import RolloutBatch, SamplingSettings, VisionLanguagePolicy
from creditflow.rollout.batch import concat_batches
from creditflow.training import GRPOConfig, GRPOTrainer
from creditflow.training.dapo import fill_batch, shape_batch
from creditflow.training.grpo_runs import grpo_policy
from tests.rollout.test_vision_policy import (  # noqa: F401 - fixtures are found by name
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)
from tests.training.helpers import make_trainer

G = 2
# Prompt p's reasoning successes: constant (all / none solved) or mixed. The translation
# reward is continuous and varies in every group: it must not keep a group.
SUCCESS = {0: [1, 1], 1: [1, 0], 2: [0, 0], 3: [0, 1], 4: [1, 1], 5: [0, 1], 6: [1, 0]}


def hand_batch(prompts: list[int], T: int = 3) -> tuple[RolloutBatch, dict[str, torch.Tensor]]:
    """G rows per prompt; row r of prompt p has completion ids (p, r, ...) and a length of
    1 + p % T tokens."""
    rows = [(p, r) for p in prompts for r in range(G)]
    B = len(rows)
    mask = torch.zeros(B, T)
    for i, (p, _) in enumerate(rows):
        mask[i, : 1 + p % T] = 1
    batch = RolloutBatch(
        prompt_ids=torch.tensor([[p] for p, _ in rows]),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=torch.tensor([[p, r, 0] for p, r in rows])[:, :T],
        completion_mask=mask,
        old_logp=torch.empty(0),
        completion_texts=[f"p{p}r{r}" for p, r in rows],
        prompt_index=torch.tensor([p for p, _ in rows]),
        group_size=G,
        truncated=torch.zeros(B, dtype=torch.bool),
    )
    rewards = {
        "reasoning": torch.tensor([float(SUCCESS[p][r]) for p, r in rows]),
        "translation": torch.tensor([0.1 * p + 0.05 * r for p, r in rows]),
    }
    return batch, rewards


class Draws:
    """A ``dapo.Draw`` over the prompt order 0, 1, 2, ...; records (offset, count)."""

    def __init__(self):
        self.calls = []

    def __call__(self, offset: int, count: int):
        self.calls.append((offset, count))
        return hand_batch(list(range(offset, offset + count)))


def groups(batch: RolloutBatch) -> list[int]:
    return batch.prompt_index[::G].tolist()


def test_constant_groups_are_dropped_and_the_batch_is_filled_by_more_draws():
    # Draw 0 holds prompts 0-3: 0 and 2 constant, 1 and 3 kept; 2 missing -> draw 4, 5: 4 is
    # constant, 5 kept; 1 missing -> draw 6: kept. Extra completions (2 + 1) * G = 6.
    draws = Draws()
    spec = DynamicSampling(reward="reasoning", success=1.0, max_extra_rollouts=100)
    batch, rewards, metrics = fill_batch(draws, spec, prompts_per_step=4)
    assert draws.calls == [(0, 4), (4, 2), (6, 1)]
    assert groups(batch) == [1, 3, 5, 6]
    assert metrics == {
        "dynamic_sampling/dropped_groups": 3.0,
        "dynamic_sampling/extra_rollouts": 6.0,
        "dynamic_sampling/draws": 3.0,
        "dynamic_sampling/filled_groups": 0.0,
    }
    # Rows and rewards travel together, and every group of the batch is informative.
    expected = {p: SUCCESS[p] for p in groups(batch)}
    assert rewards["reasoning"].view(-1, G).tolist() == [expected[p] for p in groups(batch)]
    assert rewards["translation"].tolist() == pytest.approx(
        [0.1 * p + 0.05 * r for p in groups(batch) for r in range(G)]
    )
    assert batch.completion_texts == [f"p{p}r{r}" for p in groups(batch) for r in range(G)]
    assert batch.batch_size == 4 * G


def test_the_cap_stops_the_draws_and_dropped_groups_fill_the_rest():
    # Cap 4 completions = 2 groups: one extra draw of prompts 4, 5 (5 kept); then no room.
    # The missing group is the first dropped one, prompt 0.
    draws = Draws()
    spec = DynamicSampling(max_extra_rollouts=4)
    batch, rewards, metrics = fill_batch(draws, spec, prompts_per_step=4)
    assert draws.calls == [(0, 4), (4, 2)]
    assert groups(batch) == [1, 3, 5, 0]
    assert metrics["dynamic_sampling/extra_rollouts"] == 4.0 <= spec.max_extra_rollouts
    assert metrics["dynamic_sampling/filled_groups"] == 1.0
    assert metrics["dynamic_sampling/dropped_groups"] == 3.0
    assert rewards["reasoning"].tolist() == [1, 0, 0, 1, 0, 1, 1, 1]


@pytest.mark.parametrize("cap", [0, 1])  # one group is G = 2 completions
def test_a_cap_below_one_group_draws_nothing_more(cap):
    draws = Draws()
    batch, _, metrics = fill_batch(draws, DynamicSampling(max_extra_rollouts=cap), 4)
    assert draws.calls == [(0, 4)]
    assert groups(batch) == [1, 3, 0, 2]
    assert metrics["dynamic_sampling/extra_rollouts"] == 0.0


def test_the_success_threshold_makes_the_metric_binary():
    # success 0.5 on translation (0.1 p + 0.05 r): prompt 5 -> (0.5, 0.55) constant, prompt 4
    # -> (0.4, 0.45) constant, prompts 0-3 constant below; no group is informative.
    draws = Draws()
    spec = DynamicSampling(reward="translation", success=0.5, max_extra_rollouts=4)
    batch, _, metrics = fill_batch(draws, spec, prompts_per_step=2)
    assert draws.calls == [(0, 2), (2, 2)]
    assert groups(batch) == [0, 1]
    assert metrics["dynamic_sampling/filled_groups"] == 2.0


def _config(**params) -> GRPOConfig:
    return GRPOConfig.from_params({"max_new_tokens": 3, "group_size": 2, **params})


def test_shape_batch_adds_the_overlong_penalty_to_the_named_reward_only():
    batch, rewards = hand_batch([0, 1, 2])  # lengths 1, 1, 2, 2, 3, 3
    config = _config(overlong={"buffer": 2, "penalty_factor": 0.5})
    shaped, metrics = shape_batch(batch, rewards, config)
    # max 3, buffer 2: 1 token -> 0, 2 -> -0.25, 3 -> -0.5 (times 0.5).
    penalty = torch.tensor([0, 0, -0.25, -0.25, -0.5, -0.5])
    torch.testing.assert_close(shaped["reasoning"], rewards["reasoning"] + penalty)
    assert shaped["translation"] is rewards["translation"]
    assert metrics == {"reward/overlong": pytest.approx(-1.5 / 6)}
    assert torch.equal(batch.completion_mask, hand_batch([0, 1, 2])[0].completion_mask)


def test_shape_batch_masks_truncated_completions_out_of_the_loss():
    batch, rewards = hand_batch([2, 3])
    batch.truncated = torch.tensor([False, True, False, False])
    before = batch.completion_mask.clone()
    shaped, metrics = shape_batch(batch, rewards, _config(mask_truncated_completions=True))
    assert shaped is rewards  # the advantages still see every completion's reward
    assert batch.completion_mask[1].sum() == 0
    assert torch.equal(batch.completion_mask[[0, 2, 3]], before[[0, 2, 3]])
    assert metrics == {"completion/truncated_frac": 0.25}
    batch.truncated = None
    with pytest.raises(ValueError, match="reports truncated completions"):
        shape_batch(batch, rewards, _config(mask_truncated_completions=True))


def test_shape_batch_is_a_no_op_by_default():
    batch, rewards = hand_batch([0, 1])
    mask = batch.completion_mask
    assert shape_batch(batch, rewards, _config()) == (rewards, {})
    assert batch.completion_mask is mask


# ---------------------------------------------------------------- the trainer
def parity_reward(completions, prompt_index):
    """Reasoning success constant on even prompts (all solved), alternating on odd ones; a
    continuous length reward beside it."""
    rows = torch.arange(len(completions))
    success = torch.where(prompt_index % 2 == 0, 1.0, (rows % 2).float())
    return {"reasoning": success, "length": torch.tensor([len(c) / 10 for c in completions])}


def _record_update(trainer, monkeypatch) -> dict:
    seen, update = {}, trainer.update

    def recording_update(step, batch, advantages, weights, ref_logp):
        seen.update(batch=batch, adv=advantages, model=copy.deepcopy(trainer.policy.module))
        return update(step, batch, advantages, weights, ref_logp)

    monkeypatch.setattr(trainer, "update", recording_update)
    return seen


@pytest.mark.slow
def test_trainer_with_dynamic_sampling_trains_on_informative_groups(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    trainer = make_trainer(
        make_model(),
        tapo_tokenizer,
        tapo_prompts,
        reward_fn=parity_reward,
        rewards={"reasoning": 1.0, "length": 0.1},
        prompts_per_step=3,
        group_size=2,
        num_iterations=2,  # the update needs rollout log-probs: scored once, after filling
        dynamic_sampling={"max_extra_rollouts": 12},
        loss_type="dapo",
    )
    seen = _record_update(trainer, monkeypatch)
    metrics = trainer.step(0)
    batch = seen["batch"]
    assert batch.batch_size == 6
    prompts = batch.prompt_index[::2]
    filled = int(metrics["dynamic_sampling/filled_groups"])
    assert (prompts[: 3 - filled] % 2 == 1).all(), "the informative groups come first"
    assert (prompts[3 - filled :] % 2 == 0).all()
    assert metrics["dynamic_sampling/extra_rollouts"] <= 12
    assert metrics["dynamic_sampling/dropped_groups"] >= filled
    assert metrics["dynamic_sampling/extra_rollouts"] > 0  # some even prompt was drawn
    # The kept batch was scored once, by the policy as it was at the update.
    policy = copy.copy(trainer.policy)
    policy.module = seen["model"]
    with torch.no_grad():
        expected, _ = policy.completion_logprobs(batch)
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(batch.old_logp[mask], expected[mask], atol=1e-5, rtol=0)
    assert "reward/reasoning" in metrics and metrics["actor/grad_norm"] > 0


@pytest.mark.slow
def test_trainer_with_overlong_and_truncation_masking(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    trainer = make_trainer(
        make_model(),
        tapo_tokenizer,
        tapo_prompts,
        reward_fn=parity_reward,
        rewards={"reasoning": 1.0},
        max_new_tokens=6,
        overlong={"buffer": 3},
        mask_truncated_completions=True,
        loss_type="gspo",
    )
    seen = _record_update(trainer, monkeypatch)
    metrics = trainer.step(0)
    batch = seen["batch"]
    truncated = batch.truncated
    assert truncated.any(), "an untrained tiny model runs to max_new_tokens"
    assert (batch.completion_mask[truncated].sum(dim=1) == 0).all()
    assert metrics["completion/truncated_frac"] == pytest.approx(truncated.float().mean().item())
    assert metrics["reward/overlong"] < 0
    assert metrics["completion/length"] > 0  # lengths before the masking


@pytest.mark.slow
def test_vision_language_batches_concatenate_and_score_as_their_parts(
    make_vl_model, vl_processor, vl_prompts
):
    """Two draws with different prompt lengths and image sizes (the wide picture) make one
    batch whose rows score as they did alone."""
    policy = VisionLanguagePolicy(make_vl_model(), vl_processor, SamplingSettings(max_new_tokens=6))
    torch.manual_seed(0)
    first = policy.sample(vl_prompts[:1], group_size=2)
    second = policy.sample(vl_prompts[3:], group_size=2)
    assert first.prompt_ids.shape[1] != second.prompt_ids.shape[1]
    both = concat_batches([first, second])
    with torch.no_grad():
        joint, _ = policy.completion_logprobs(both)
        parts = [policy.completion_logprobs(b)[0] for b in (first, second)]
    for rows, part in zip((slice(0, 2), slice(2, 4)), parts, strict=True):
        T = part.shape[1]
        mask = both.completion_mask[rows, :T].bool()
        torch.testing.assert_close(joint[rows, :T][mask], part[mask], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_vision_language_tor_step_with_dynamic_sampling(
    make_vl_model, vl_processor, vl_prompts, monkeypatch
):
    config = GRPOConfig.from_params(
        {
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 2,
            "max_new_tokens": 6,
            "rewards": {"reasoning": 1.0},
            "token_weights": {"name": "tor"},
            "dynamic_sampling": {"max_extra_rollouts": 4},
            "checkpoint_every": 0,
            "log_samples_every": 0,
        }
    )
    policy = grpo_policy(make_vl_model(), vl_processor, config)
    trainer = GRPOTrainer(policy, vl_prompts, parity_reward, config, progress=False)
    seen = _record_update(trainer, monkeypatch)
    metrics = trainer.step(0)
    batch = seen["batch"]
    assert batch.batch_size == 4 and batch.entropy is not None
    assert batch.old_logp.shape == batch.completion_mask.shape  # scored for ToR, once
    assert metrics["dynamic_sampling/draws"] >= 1 and "tor/reasoning_frac" in metrics
