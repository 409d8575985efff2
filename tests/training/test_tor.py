"""ToR in the engine (docs/methods/tor.md): batch-global selection (one process, two simulated
ranks), the ``tor`` strategy rows and their options, and a ToR training step on a real tiny
Qwen2.5-VL (the VL warm start is in test_sft_vision_language.py)."""

# The VL fixtures are imported from the rollout tests and requested by name as parameters.
# ruff: noqa: F811

import copy
import math
import os
import socket
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given
from hypothesis import strategies as st

from creditflow.algorithms import (
    policy_loss,
    top_fraction_mask,
    tor_token_weights,
    visual_sensitivity,
)
from creditflow.errors import ConfigError
from creditflow.rollout import SamplingSettings, VisionLanguagePolicy
from creditflow.training import TOKEN_WEIGHT_STRATEGIES, GRPOConfig, GRPOTrainer
from creditflow.training.grpo_runs import grpo_policy
from creditflow.training.seeding import step_seed
from creditflow.training.strategies import WeightContext, check_image_pass, validate_strategies
from creditflow.training.strategies.tor import (
    batch_top_fraction_mask,
    batch_tor_token_weights,
    tor_options,
)
from tests.rollout.test_vision_policy import (  # noqa: F401 - fixtures are found by name
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)
from tests.training.helpers import length_reward


def _random_case(seed: int, B: int = 4, T: int = 7, levels: int = 3):
    """Scores with many ties (``levels`` distinct values) and ragged right padding."""
    g = torch.Generator().manual_seed(seed)
    entropy = torch.randint(levels, (B, T), generator=g).float() / levels
    sensitivity = torch.randint(levels, (B, T), generator=g).float() * 0.25
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    return entropy, sensitivity, mask


# ---------------------------------------------------------------- one process
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 1.0])
def test_single_process_selection_is_top_fraction_mask(seed, fraction):
    scores, _, mask = _random_case(seed)
    expected = top_fraction_mask(scores, mask, fraction, torch.Generator().manual_seed(seed))
    got = batch_top_fraction_mask(scores, mask, fraction, torch.Generator().manual_seed(seed))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"overlap": "reasoning"},
        {"alpha_r": 0.5, "alpha_p": 0.1, "gamma_r": 2.0, "gamma_p": 0.25},
        {"gamma_p": 0.0},
    ],
)
def test_single_process_weights_and_metrics_are_tor_token_weights(seed, options):
    entropy, sensitivity, mask = _random_case(seed, B=5, T=9)
    expected, expected_metrics = tor_token_weights(
        entropy, sensitivity, mask, **options, generator=torch.Generator().manual_seed(seed)
    )
    got, metrics = batch_tor_token_weights(
        entropy, sensitivity, mask, **options, generator=torch.Generator().manual_seed(seed)
    )
    assert torch.equal(got, expected)
    assert metrics == expected_metrics


def test_selection_is_over_the_batch_not_per_sequence():
    # Row 0 holds the 3 highest entropies of the 10 valid tokens: ceil(0.3 * 10) = 3 tokens,
    # all in row 0; row 1 (and the padding after its 5 tokens) gets none.
    entropy = torch.tensor([[9.0, 8.0, 7.0, 0.1, 0.1], [1.0, 1.0, 1.0, 1.0, 1.0]])
    mask = torch.ones(2, 5)
    selected = batch_top_fraction_mask(entropy, mask, 0.3)
    assert selected.tolist() == [[True, True, True, False, False], [False] * 5]


@given(seed=st.integers(0, 10_000), alpha_r=st.floats(0, 1), alpha_p=st.floats(0, 1))
def test_weights_are_zero_off_the_selected_sets(seed, alpha_r, alpha_p):
    entropy, sensitivity, mask = _random_case(seed, B=3, T=6, levels=4)
    weights, metrics = batch_tor_token_weights(
        entropy,
        sensitivity,
        mask,
        alpha_r=alpha_r,
        alpha_p=alpha_p,
        generator=torch.Generator().manual_seed(seed),
    )
    n_valid = int(mask.sum())
    k_r, k_p = (math.ceil(round(a * n_valid, 6)) for a in (alpha_r, alpha_p))
    reasoning = (weights == 1.0) | (weights == 1.5)
    perception = (weights == 0.5) | (weights == 1.5)
    assert set(weights.unique().tolist()) <= {0.0, 0.5, 1.0, 1.5}
    assert int(reasoning.sum()) == k_r and int(perception.sum()) == k_p
    assert not weights[mask == 0].any(), "padding is never selected"
    assert metrics["tor/reasoning_frac"] == pytest.approx(k_r / n_valid)
    # Every unselected valid token scores at most the lowest selected one.
    for scores, chosen in ((entropy, reasoning), (sensitivity, perception)):
        if chosen.any() and (mask.bool() & ~chosen).any():
            assert scores[mask.bool() & ~chosen].max() <= scores[chosen].min()


# ---------------------------------------------------------------- two simulated processes
class ThreadRanks:
    """``world`` fake accelerators in threads; ``gather`` concatenates every rank's tensor in
    rank order (what ``Accelerator.gather`` does), so the cross-process path runs for real."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list = [None] * world

    def accelerator(self, rank: int):
        ranks = self

        class FakeAccelerator:
            num_processes = ranks.world
            process_index = rank
            device = torch.device("cpu")

            def gather(self, tensor: torch.Tensor) -> torch.Tensor:
                ranks.barrier.wait()
                ranks.slots[rank] = tensor.clone()
                ranks.barrier.wait()
                out = torch.cat(ranks.slots, dim=0)
                ranks.barrier.wait()
                return out

        return FakeAccelerator()

    def run(self, fn, shares: list) -> list:
        results: list = [None] * self.world
        errors: list = []

        def work(rank: int) -> None:
            try:
                results[rank] = fn(*shares[rank], self.accelerator(rank))
            except Exception as exc:  # surfaced below; a dead thread would hang the barrier
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=work, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        if errors:
            raise errors[0]
        return results


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.75])
def test_two_ranks_select_what_one_process_selects_on_the_whole_batch(seed, fraction):
    """Same T on both ranks: rank r's rows are rows [4r, 4r + 4) of the concatenated batch, whose
    flattened positions (and tie-breaking keys) line up, so the union is top_fraction_mask."""
    scores, _, mask = _random_case(seed, B=8, T=6)
    expected = top_fraction_mask(scores, mask, fraction, torch.Generator().manual_seed(seed))

    def select(scores, mask, accelerator):
        generator = torch.Generator().manual_seed(seed)  # the same on every rank
        return batch_top_fraction_mask(scores, mask, fraction, generator, accelerator)

    halves = ThreadRanks(2).run(select, [(scores[:4], mask[:4]), (scores[4:], mask[4:])])
    assert torch.equal(torch.cat(halves), expected)


@pytest.mark.parametrize("seed", range(4))
def test_two_ranks_with_different_lengths_select_k_over_both(seed):
    """Different T per rank (padding differs): exactly ceil(0.3 * n_valid of both) tokens are
    selected in total, and the choice is a top-k: nothing unselected beats anything selected.
    In the hand-made ranking below, rank 1 holds all the top scores."""
    low, _, low_mask = _random_case(seed, B=3, T=5)  # scores in [0, 1)
    high, _, high_mask = _random_case(seed + 100, B=3, T=9)
    high = high + 10.0
    n_valid = int(low_mask.sum() + high_mask.sum())
    k = math.ceil(round(0.3 * n_valid, 6))
    picked = ThreadRanks(2).run(
        lambda s, m, acc: batch_top_fraction_mask(s, m, 0.3, torch.Generator(), acc),
        [(low, low_mask), (high, high_mask)],
    )
    assert int(picked[0].sum() + picked[1].sum()) == k
    if k <= int(high_mask.sum()):
        assert not picked[0].any(), "rank 0's tokens all score below rank 1's"
    for selected, mask in (
        (picked[0], low_mask),
        (picked[1], high_mask),
    ):
        assert not selected[mask == 0].any()
    chosen = torch.cat([low[picked[0]], high[picked[1]]])
    rest = torch.cat([low[low_mask.bool() & ~picked[0]], high[high_mask.bool() & ~picked[1]]])
    assert rest.max() <= chosen.min()


def test_two_ranks_tor_weights_use_a_global_threshold():
    """Hand case, 2 ranks x 1 row x 5 tokens, alpha_r = 0.3 of 10 valid tokens -> k = 3.
    Entropies rank 0: (5, 1, 1, 1, 1); rank 1: (4, 3, 1, 1, 1): T_r = {r0:0, r1:0, r1:1}.
    A per-rank selection would have taken ceil(0.3 * 5) = 2 tokens on each rank instead."""
    entropy = [torch.tensor([[5.0, 1, 1, 1, 1]]), torch.tensor([[4.0, 3, 1, 1, 1]])]
    zeros, ones = torch.zeros(1, 5), torch.ones(1, 5)

    def weigh(entropy, accelerator):
        return batch_tor_token_weights(
            entropy, zeros, ones, 0.3, 0.0, 1.0, 0.5, "sum", torch.Generator(), accelerator
        )[0]

    r0, r1 = ThreadRanks(2).run(weigh, [(entropy[0],), (entropy[1],)])
    assert r0.tolist() == [[1.0, 0, 0, 0, 0]] and r1.tolist() == [[1.0, 1.0, 0, 0, 0]]


def _gloo_worker(rank: int, port: int, workdir: str) -> None:
    """One of two real processes (gloo, through accelerate): ToR weights of its half."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    from accelerate import Accelerator  # noqa: PLC0415 - after the environment is set

    accelerator = Accelerator(cpu=True)
    entropy, sensitivity, mask = torch.load(f"{workdir}/inputs.pt")
    rows = slice(4 * rank, 4 * rank + 4)
    weights, _ = batch_tor_token_weights(
        entropy[rows],
        sensitivity[rows],
        mask[rows],
        generator=torch.Generator().manual_seed(3),
        accelerator=accelerator,
    )
    torch.save(weights, f"{workdir}/rank{rank}.pt")
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_weigh_like_one_process_on_the_whole_batch(tmp_path):
    entropy, sensitivity, mask = _random_case(11, B=8, T=6)
    torch.save((entropy, sensitivity, mask), tmp_path / "inputs.pt")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.spawn(_gloo_worker, args=(port, str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the 2-process run did not finish in 120 s")
    halves = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    expected, _ = tor_token_weights(
        entropy, sensitivity, mask, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(torch.cat(halves), expected)


# ---------------------------------------------------------------- options
@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"name": "tor", "alpha": 0.3}, r"got unknown \['alpha'\]"),
        ({"name": "tor", "alpha_r": 1.5}, r"alpha_r must be in \[0, 1\]"),
        ({"name": "tor", "alpha_p": -0.1}, r"alpha_p must be in \[0, 1\]"),
        ({"name": "tor", "gamma_p": -1.0}, "gamma_p must be >= 0"),
        ({"name": "tor", "overlap": "max"}, r"overlap must be one of \['sum', 'reasoning'\]"),
        ({"name": "tor", "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"name": "tor", "top_p": 0.9}, r"must equal entropy_top_p \(0.95\)"),
        ({"name": "tor_reasoning_only", "gamma_p": 0.5}, "fixed by the 'tor_reasoning_only'"),
        ({"name": "tor_perception_only", "gamma_r": 1.0}, "fixed by the 'tor_perception_only'"),
    ],
)
def test_bad_tor_options_fail_in_config_validation(spec, match):
    with pytest.raises(ConfigError, match=match):
        validate_strategies(GRPOConfig.from_params({"token_weights": spec}))


def test_presets_fix_the_ablated_weight_and_keep_paper_defaults():
    assert tor_options({"name": "tor"}) == {
        "alpha_r": 0.3,
        "alpha_p": 0.3,
        "gamma_r": 1.0,
        "gamma_p": 0.5,
        "overlap": "sum",
    }
    assert tor_options({"name": "tor_reasoning_only", "alpha_r": 0.2})["gamma_p"] == 0.0
    assert tor_options({"name": "tor_perception_only"})["gamma_r"] == 0.0
    for name in ("tor", "tor_reasoning_only", "tor_perception_only"):
        validate_strategies(
            GRPOConfig.from_params({"token_weights": {"name": name, "top_p": 0.95}})
        )


# ---------------------------------------------------------------- the strategy on a real rollout
@pytest.fixture(scope="module")
def vl_rollout(make_vl_model, vl_processor, vl_prompts):
    policy = VisionLanguagePolicy(make_vl_model(), vl_processor, SamplingSettings(max_new_tokens=8))
    torch.manual_seed(0)
    return policy, policy.sample(vl_prompts, group_size=3, with_entropy=True)


@pytest.mark.parametrize(
    ("name", "options", "expected_options"),
    [
        ("tor", {}, {}),
        ("tor", {"overlap": "reasoning", "alpha_p": 0.5}, {"overlap": "reasoning", "alpha_p": 0.5}),
        ("tor_reasoning_only", {}, {"gamma_p": 0.0}),
        ("tor_perception_only", {"gamma_p": 2.0}, {"gamma_r": 0.0, "gamma_p": 2.0}),
    ],
)
def test_tor_strategy_weighs_entropy_and_visual_sensitivity(
    vl_rollout, name, options, expected_options
):
    """weights = tor_token_weights(batch.entropy, |old_logp - no-image logp|, mask) with the
    step generator; the ablations only change gamma."""
    policy, batch = vl_rollout
    context = WeightContext(generator=torch.Generator().manual_seed(7))
    weights, metrics = TOKEN_WEIGHT_STRATEGIES[name].compute(
        {"name": name, **options}, batch, policy, context
    )
    sensitivity = visual_sensitivity(batch.old_logp, policy.no_image_logprobs(batch))
    expected, expected_metrics = tor_token_weights(
        batch.entropy,
        sensitivity,
        batch.completion_mask,
        **{**tor_options({"name": "tor"}), **expected_options},
        generator=torch.Generator().manual_seed(7),
    )
    assert torch.equal(weights, expected)
    assert {k: v for k, v in metrics.items() if k.startswith("tor/")} == expected_metrics
    assert 0 < metrics["time/no_image_pass_s"] <= metrics["time/tor_weights_s"]
    assert expected_metrics["tor/sensitivity_selected"] > 0


def test_tor_strategy_needs_entropy_and_a_no_image_pass(vl_rollout):
    policy, batch = vl_rollout
    context = WeightContext(generator=torch.Generator())
    tor = TOKEN_WEIGHT_STRATEGIES["tor"]
    without_entropy = copy.copy(batch)
    without_entropy.entropy = None
    with pytest.raises(ValueError, match="with_entropy=True"):
        tor.compute({"name": "tor"}, without_entropy, policy, context)
    with pytest.raises(TypeError, match="no_image_logprobs"):
        tor.compute({"name": "tor"}, batch, object(), context)
    # The trainer and a comparison's check ask first, with a ConfigError before training.
    assert tor.needs_image_pass and not TOKEN_WEIGHT_STRATEGIES["uniform"].needs_image_pass
    config = GRPOConfig(token_weights={"name": "tor_reasoning_only"})
    with pytest.raises(ConfigError, match="'tor_reasoning_only' needs.*LanguagePolicy has none"):
        check_image_pass(config, False, "LanguagePolicy")
    check_image_pass(config, True, "VisionLanguagePolicy")


def _vl_trainer(model, processor, prompts, **overrides) -> GRPOTrainer:
    params = {
        "steps": 2,
        "prompts_per_step": 2,
        "group_size": 4,
        "max_new_tokens": 8,
        "rewards": {"length": 1.0},
        "learning_rate": 1e-2,
        "warmup_steps": 0,
        "checkpoint_every": 0,
        "log_samples_every": 0,
        "token_weights": {"name": "tor"},
        **overrides,
    }
    config = GRPOConfig.from_params(params)
    policy = grpo_policy(model, processor, config)
    return GRPOTrainer(policy, prompts, length_reward, config, progress=False)


def test_tor_step_changes_parameters_and_its_loss_is_policy_loss_with_tor_weights(
    make_vl_model, vl_processor, vl_prompts, monkeypatch
):
    model = make_vl_model()
    trainer = _vl_trainer(model, vl_processor, vl_prompts, clip_low=0.15)
    seen = {}
    update = trainer.update

    def recording_update(step, batch, advantages, weights, ref_logp):
        seen.update(model=copy.deepcopy(model), batch=batch, adv=advantages, w=weights)
        return update(step, batch, advantages, weights, ref_logp)

    monkeypatch.setattr(trainer, "update", recording_update)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    metrics = trainer.step(0)

    batch = seen["batch"]
    assert batch.entropy is not None, "the trainer samples with entropy for ToR"
    # The weights are ToR's for this rollout and the step's generator.
    policy = grpo_policy(seen["model"], vl_processor, trainer.config)
    sensitivity = visual_sensitivity(batch.old_logp, policy.no_image_logprobs(batch))
    expected_w, _ = tor_token_weights(
        batch.entropy,
        sensitivity,
        batch.completion_mask,
        generator=torch.Generator().manual_seed(step_seed(0, 0, 1)),  # the step's generator
    )
    assert torch.equal(seen["w"], expected_w)
    assert set(seen["w"].unique().tolist()) <= {0.0, 0.5, 1.0, 1.5}
    # The loss is policy_loss with those weights (seq-mean-token-mean over all tokens).
    logp, _ = policy.completion_logprobs(batch)
    expected, _ = policy_loss(
        logp,
        batch.old_logp,
        seen["adv"],
        batch.completion_mask,
        weights=seen["w"],
        clip_low=0.15,
        clip_high=0.2,
        max_len=8,
    )
    assert metrics["actor/loss"] == pytest.approx(expected.item(), abs=1e-6)
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert len(changed) > 0.9 * len(before)
    for key in ("tor/reasoning_frac", "tor/perception_frac", "tor/overlap_frac"):
        assert 0 <= metrics[key] <= 1
    assert metrics["tor/reasoning_frac"] >= 0.3 and metrics["time/no_image_pass_s"] > 0


def test_uniform_vl_step_runs_no_no_image_pass(
    make_vl_model, vl_processor, vl_prompts, monkeypatch
):
    model = make_vl_model()
    trainer = _vl_trainer(model, vl_processor, vl_prompts, token_weights={"name": "uniform"})
    calls = []
    monkeypatch.setattr(
        VisionLanguagePolicy, "no_image_logprobs", lambda self, batch: calls.append(batch)
    )
    metrics = trainer.step(0)
    assert calls == [] and "time/no_image_pass_s" not in metrics
