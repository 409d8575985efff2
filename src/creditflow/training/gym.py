"""The Credit Gym's loop (docs/methods/credit_gym.md): every strategy trains the gym's tiny
policy with the shipped ``GRPOTrainer`` (its strategies looked up by name, its loss, its
optimizer) on a world whose true credit is known, and is scored on how well its credit finds
the decisive tokens and how fast it learns.

One run: world and warm start from the seed (the same for every strategy, so differences
are paired) -> ``steps`` GRPO steps -> per step the exact expected reward; at the first, the
middle and the last step a probe batch drawn from the current policy, on which the strategy's
credit ``A * w`` (the trainer's own strategies) is compared with the oracle credit.

Only the positive-control ``oracle`` strategy reads the world's truth (the decisive positions);
it lives here, labelled so, and is never registered with the shipped strategies.

Shape symbols: ``B`` completions, ``T`` content positions, ``L = T + 1`` completion tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from creditflow.config.grpo import GRPOConfig
from creditflow.reporting.credit_recovery import recovery_scores
from creditflow.rollout.batch import RolloutBatch
from creditflow.tasks.credit_gym import (
    GymKnobs,
    GymWorld,
    all_prompts,
    build_world,
    expected_total_reward,
    gym_rewards,
    oracle_credit,
)
from creditflow.training.grpo import GRPOTrainer
from creditflow.training.gym_policy import GymNet, GymPolicy, warm_start_prior
from creditflow.training.seeding import step_seed
from creditflow.training.strategies import (
    Metrics,
    SignConflictRate,
    TokenWeightStrategy,
    WeightContext,
)
from creditflow.training.strategies.base import no_options

logger = logging.getLogger(__name__)

KNOBS = tuple(GymKnobs.__dataclass_fields__)
ORACLE = "oracle"  # the name of the positive control in a gym's strategy list


@dataclass(frozen=True)
class GymSetup:
    """What every run of a sweep shares.

    grpo: the GRPOConfig fields of every run (the strategy's specs are set per strategy).
    world: keyword arguments of ``tasks.credit_gym.build_world`` (n_families, length, ...).
    hidden: width of the policy's shared network. probe_prompts: prompts of each probe batch.
    target_share: "steps to target" counts the steps until the expected reward has closed
        this share of the gap from the warm start to the optimum.
    """

    grpo: Mapping[str, Any]
    world: Mapping[str, Any] = field(default_factory=dict)
    hidden: int = 32
    probe_prompts: int = 16
    target_share: float = 0.5

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> GymSetup:
        """The setup of ``params:credit_gym`` (its unset GRPO fields left to the defaults)."""
        return cls(
            grpo={k: v for k, v in params["grpo"].items() if v is not None},
            world=params["world"],
            hidden=params["hidden"],
            probe_prompts=params["probe_prompts"],
            target_share=params["target_share"],
        )


def oracle_weights(world: GymWorld) -> TokenWeightStrategy:
    """POSITIVE CONTROL, reads the hidden truth: weight 1 on the world's decisive tokens, 0 on
    the free ones and the tag. A gym that cannot show it recovering credit (AUC 1) and
    learning faster than uniform weights cannot tell any strategy apart."""

    def compute(spec, batch: RolloutBatch, policy: Any, context: WeightContext):
        family = batch.prompt_ids[:, 0]
        decisive = world.decisive[family].float()  # (B, T)
        p = world.tag_position
        tag = torch.zeros(len(family), 1)
        return torch.cat([decisive[:, :p], tag, decisive[:, p:]], dim=1), {}

    return TokenWeightStrategy(compute, no_options)


def content_columns(world: GymWorld, tensor: torch.Tensor) -> torch.Tensor:
    """(B, T) the content positions of a (B, L) completion tensor (the tag dropped)."""
    p = world.tag_position
    return torch.cat([tensor[:, :p], tensor[:, p + 1 :]], dim=1)


def strategy_config(setup: GymSetup, spec: Mapping[str, Any], seed: int, length: int) -> GRPOConfig:
    """The GRPOConfig of one run: the setup's fields, the strategy's specs, the seed."""
    token_weights = dict(spec.get("token_weights", {"name": "uniform"}))
    if spec.get(ORACLE):
        token_weights = {"name": "uniform"}  # replaced by oracle_weights in the trainer
    return GRPOConfig(
        **{
            **dict(setup.grpo),
            **dict(spec.get("grpo") or {}),  # the strategy's own loss settings (loss_type, ...)
            "advantage": dict(spec.get("advantage", {"name": "grpo"})),
            "token_weights": token_weights,
            "rewards": {"translation": 1.0, "reasoning": 1.0},
            "max_new_tokens": length + 1,
            "seed": seed,
        }
    )


def gym_reward_fn(world: GymWorld, prompts: list[tuple[int, int]], policy: GymPolicy, seed: int):
    """The trainer's ``reward_fn``: the world's rewards of decoded completions, with the
    world's reward noise drawn from a generator of the run's seed."""
    generator = torch.Generator().manual_seed(seed + 104729)
    table = torch.tensor(prompts, dtype=torch.long)  # (P, 2)

    def reward_fn(texts: list[str], prompt_index: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = table[prompt_index]
        tokens = torch.tensor([policy.tokenizer.content_ids(t) for t in texts])  # (B, T)
        return gym_rewards(world, rows[:, 0], rows[:, 1], tokens, generator)

    return reward_fn


def exact_reward_share(world: GymWorld, policy: GymPolicy) -> float:
    """The policy's exact expected total reward over every prompt, as a share of the optimum."""
    family, image = all_prompts(world)
    probs = policy.content_probs(torch.stack([family, image], 1))  # (F*K, T, V)
    expected = expected_total_reward(world, family, image, probs)
    return float(expected.sum() / world.max_reward(family).sum())


def probe(
    world: GymWorld, trainer: GRPOTrainer, policy: GymPolicy, prompts: list, step: int, n: int
) -> Metrics:
    """Recovery scores of the trainer's strategies on a fresh batch of the current policy."""
    c = trainer.config
    gen = torch.Generator().manual_seed(step_seed(c.seed, step, 11))
    picked = torch.randint(len(prompts), (n,), generator=gen)
    torch.manual_seed(step_seed(c.seed, step, 13))  # shuffled advantages' draw
    batch = policy.sample([prompts[i] for i in picked.tolist()], c.group_size, True, True)
    batch.prompt_index = picked.repeat_interleave(c.group_size)
    rewards = trainer.reward_fn(batch.completion_texts, batch.prompt_index)
    advantages, _ = trainer.advantage.compute(c.advantage, rewards, batch, policy, c)
    context = WeightContext(generator=torch.Generator().manual_seed(step_seed(c.seed, step, 17)))
    weights, _ = trainer.token_weights.compute(c.token_weights, batch, policy, context)
    family, image = batch.prompt_ids[:, 0], batch.prompt_ids[:, 1]
    tokens = content_columns(world, batch.completion_ids)
    credit = content_columns(world, (advantages * weights).detach())  # (B, T)
    oracle = oracle_credit(world, family, image, tokens, policy.content_probs(batch.prompt_ids))
    scores = recovery_scores(credit.numpy(), oracle.numpy(), world.decisive[family].numpy())
    scores["conflict/sign_rate"] = SignConflictRate()(rewards, c.group_size).get(
        "adv/sign_conflict_rate", float("nan")
    )
    return scores


def run_strategy(
    setup: GymSetup, knobs: GymKnobs, seed: int, name: str, spec: Mapping[str, Any]
) -> dict[str, Any]:
    """One run of strategy ``spec`` at ``knobs`` and ``seed``: a row of the per-seed table
    (recovery at the first / middle / last step, final reward share, steps to target)."""
    world = build_world(knobs, seed, **setup.world)
    config = strategy_config(setup, spec, seed, world.length)
    prior, image_prior = warm_start_prior(world, seed)
    net = GymNet(prior, image_prior, setup.hidden, seed)
    policy = GymPolicy(net, world.tag_position, world.vocab_size, config.entropy_top_p)
    family, image = all_prompts(world)
    prompts = list(zip(family.tolist(), image.tolist(), strict=True))
    trainer = GRPOTrainer(
        policy,
        prompts,
        gym_reward_fn(world, prompts, policy, seed),
        config,
        progress=False,
        step_callback=lambda step, metrics: None,
    )
    if spec.get(ORACLE):
        trainer.token_weights = oracle_weights(world)
    steps = config.steps
    probe_at = {"first": 0, "middle": steps // 2, "last": steps - 1}
    start = exact_reward_share(world, policy)
    curve, row = [start], {}
    for step in range(steps):
        for label, at in probe_at.items():
            if at == step:
                for key, value in probe(
                    world, trainer, policy, prompts, step, setup.probe_prompts
                ).items():
                    row[f"{key}@{label}"] = value
        trainer.step(step)
        curve.append(exact_reward_share(world, policy))
    gap = 1.0 - start
    reached = [i for i, share in enumerate(curve) if share - start >= setup.target_share * gap]
    row.update(
        {
            "strategy": name,
            "seed": seed,
            **asdict(knobs),
            "start_reward": start,
            "final_reward": curve[-1],
            "gain": curve[-1] - start,
            # a run that never reached the target counts one step past the budget
            "steps_to_target": reached[0] if reached else steps + 1,
            "mean_reward": float(np.mean(curve[1:])),
        }
    )
    return row


def sweep_points(
    defaults: GymKnobs, sweeps: Mapping[str, Sequence[float]]
) -> list[tuple[str, float, GymKnobs]]:
    """``(knob, dose, knobs)`` for every dose of every swept knob, the others at their
    defaults."""
    unknown = sorted(set(sweeps) - set(KNOBS))
    if unknown:
        raise ValueError(f"unknown gym knobs {unknown}; valid: {list(KNOBS)}")
    return [
        (k, float(d), replace(defaults, **{k: float(d)})) for k, ds in sweeps.items() for d in ds
    ]


def run_sweep(
    setup: GymSetup,
    defaults: GymKnobs,
    sweeps: Mapping[str, Sequence[float]],
    strategies: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Every strategy at every sweep point and seed; rows of the per-seed table, each with
    the ``knob`` and ``dose`` it belongs to. A point shared by several knobs (the defaults)
    runs once."""
    points = sweep_points(defaults, sweeps)
    done: dict[tuple, dict[str, Any]] = {}
    rows = []
    started = time.perf_counter()
    bar = tqdm(points, desc="credit gym", disable=not progress)
    for knob, dose, knobs in bar:
        bar.set_postfix(knob=knob, dose=dose)
        for seed in seeds:
            for name, spec in strategies.items():
                key = (knobs, seed, name)
                if key not in done:
                    done[key] = run_strategy(setup, knobs, seed, name, spec)
                rows.append({"knob": knob, "dose": dose, **done[key]})
    logger.info(
        "credit gym: %d runs (%d points x %d seeds x %d strategies, shared points once) in %.1f s",
        len(done),
        len(points),
        len(seeds),
        len(strategies),
        time.perf_counter() - started,
    )
    return rows
