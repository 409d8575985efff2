"""One-step off-policy GRPO (max_staleness=1): the sampling process, the lag's correction,
the staleness limit and resuming."""

import math

import pytest
import torch

from creditflow.config.grpo import DEFAULT_STALENESS_CAP
from creditflow.errors import ConfigError, StaleWeightsError, WorkerError
from creditflow.rollout.batch import RolloutBatch
from creditflow.training import CheckpointStore, GRPOConfig
from creditflow.training.offpolicy import RolloutAhead, lag_corrected
from tests.training.helpers import make_trainer

# 3 steps of 2 prompts x 4 completions, 8 new tokens: every step after the first trains a
# batch drawn one update behind.
OFF_POLICY = {"steps": 3, "max_staleness": 1}


def _without_timing(history):
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in history]


def test_batches_after_the_first_are_one_update_behind_and_corrected(
    make_model, tapo_tokenizer, tapo_prompts
):
    """Step 1 samples the starting weights (staleness 0), steps 2 and 3 the weights before
    the previous update (staleness 1): their sampler log-probs then differ from the trainer's
    (the ratio is no longer ~1), and the parameters still train."""
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    history = make_trainer(model, tapo_tokenizer, tapo_prompts, **OFF_POLICY).train().history
    assert [row["rollout/staleness"] for row in history] == [0.0, 1.0, 1.0]
    # Step 1: lean's sampler and the trainer's forward score the same weights (float noise).
    assert history[0]["rollout/sampler_logp_abs_diff"] < 1e-4
    # lr 1e-2 on a tiny model moves the log-probs far more than float noise.
    assert all(row["rollout/sampler_logp_abs_diff"] > 1e-3 for row in history[1:])
    assert all(row["time/rollout_wait_s"] >= 0 for row in history)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_first_step_matches_the_on_policy_run(make_model, tapo_tokenizer, tapo_prompts):
    """The sampling process draws step 1 as the trainer itself would (same prompts, same
    random stream, same weights): the same completions, rewards and loss."""
    rows = {}
    for staleness in (0, 1):
        trainer = make_trainer(
            make_model(), tapo_tokenizer, tapo_prompts, steps=1, max_staleness=staleness
        )
        rows[staleness] = trainer.train().history[0]
    for key in ("reward/total", "reward/length", "completion/length"):
        assert rows[1][key] == rows[0][key], key
    torch.testing.assert_close(rows[1]["actor/loss"], rows[0]["actor/loss"], atol=1e-5, rtol=0)


def test_lag_correction_weighs_each_token_by_its_truncated_ratio():
    # ratios exp(0 - (-1)) = e (truncated to 2), exp(-1 - 0) = 0.3679, and padding stays 1.
    batch = RolloutBatch(
        prompt_ids=torch.zeros(1, 1, dtype=torch.long),
        prompt_mask=torch.ones(1, 1, dtype=torch.long),
        completion_ids=torch.zeros(1, 3, dtype=torch.long),
        completion_mask=torch.tensor([[1.0, 1.0, 0.0]]),
        old_logp=torch.empty(0),
        completion_texts=["x"],
        prompt_index=torch.zeros(1, dtype=torch.long),
        group_size=1,
        sampler_logp=torch.tensor([[-1.0, 0.0, 0.0]]),
    )
    trainer_logp = torch.tensor([[0.0, -1.0, -5.0]])
    weights, metrics = lag_corrected(torch.full((1, 3), 0.5), trainer_logp, batch, cap=2.0)
    torch.testing.assert_close(
        weights, torch.tensor([[1.0, 0.5 * 0.36788, 0.5]]), atol=1e-4, rtol=0
    )
    assert metrics["rollout/is_ratio_max"] == pytest.approx(math.e, rel=1e-6)
    unchanged, none = lag_corrected(torch.ones(1, 3), trainer_logp, batch, cap=None)
    assert torch.equal(unchanged, torch.ones(1, 3)) and none == {}


def test_the_cap_defaults_to_trls_when_the_sampler_lags():
    assert GRPOConfig(max_staleness=1).importance_cap() == DEFAULT_STALENESS_CAP
    assert GRPOConfig(max_staleness=1, importance_sampling_cap=1.5).importance_cap() == 1.5
    assert GRPOConfig().importance_cap() is None


@pytest.mark.parametrize("value", [-1, 2])
def test_max_staleness_outside_0_1_is_a_config_error(value):
    with pytest.raises(ConfigError, match="max_staleness must be 0"):
        GRPOConfig.from_params({"max_staleness": value})


def test_a_batch_further_behind_than_allowed_fails_the_run(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    """A sampling process that missed a weight push (tagged one step older) is refused."""
    request = RolloutAhead._request

    def missed_push(self, step, weights_step):
        request(self, step, weights_step - 1 if step else weights_step)

    monkeypatch.setattr(RolloutAhead, "_request", missed_push)
    trainer = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, **OFF_POLICY)
    with pytest.raises(
        StaleWeightsError, match="after -1 steps, 2 behind the trainer's; max_staleness allows 1"
    ):
        trainer.train()
    assert len(trainer.result.history) == 1 and trainer.ahead is None  # the process is closed


def test_an_error_in_the_sampling_process_reaches_the_trainer(
    make_model, tapo_tokenizer, tapo_prompts
):
    def broken_reward(completions, prompt_index):
        raise ValueError("no reward today")

    trainer = make_trainer(
        make_model(), tapo_tokenizer, tapo_prompts, reward_fn=broken_reward, **OFF_POLICY
    )
    with pytest.raises(WorkerError, match="ValueError: no reward today"):
        trainer.train()


def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path, monkeypatch
):
    """Killed when step 3 starts (checkpoint after step 2, which stored step 3's batch, drawn
    with step 2's weights), then resumed: the same weights and metrics as a run never
    interrupted, bit for bit."""
    settings = {**OFF_POLICY, "steps": 4, "checkpoint_every": 2}
    straight_model = make_model()
    expected = make_trainer(straight_model, tapo_tokenizer, tapo_prompts, **settings).train()

    def trainer(model):
        store = CheckpointStore(tmp_path, keep=1)
        return make_trainer(model, tapo_tokenizer, tapo_prompts, checkpoints=store, **settings)

    first = trainer(make_model())
    step = first.step

    def interrupted(i):
        if i == 2:
            raise KeyboardInterrupt
        return step(i)

    monkeypatch.setattr(first, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    resumed_model = make_model()
    resumed = trainer(resumed_model)
    assert resumed.start_step == 2 and resumed._pending_rollout["weights_step"] == 1
    result = resumed.train()
    for (name, a), b in zip(
        straight_model.named_parameters(), resumed_model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    assert _without_timing(result.history) == _without_timing(expected.history)
    assert [row["rollout/staleness"] for row in result.history] == [0.0, 1.0, 1.0, 1.0]
