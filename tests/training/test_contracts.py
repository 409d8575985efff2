"""The contract checks of ``creditflow.testing``: every shipped strategy and reward passes them
(parametrized over the name tables, so a strategy or reward added there is checked too), and
each check catches the breach it is for."""

from __future__ import annotations

import pytest
import torch

from creditflow.rewards import REWARD_FUNCTIONS
from creditflow.testing import (
    check_advantage_strategy,
    check_reward,
    check_token_weight_strategy,
    toy_batch,
)
from creditflow.training.strategies import (
    ADVANTAGE_STRATEGIES,
    TOKEN_WEIGHT_STRATEGIES,
    TokenWeightStrategy,
)
from creditflow.training.strategies.base import no_options

# The controls draw at random over batch positions: group order and splitting hold in
# distribution only (creditflow.testing); everything else is checked.
POSITIONAL_DRAWS = {"shuffled_advantages", "random_tokens"}


@pytest.mark.parametrize("name", sorted(ADVANTAGE_STRATEGIES))
def test_every_shipped_advantage_strategy_keeps_the_contract(name):
    advantages = check_advantage_strategy(name, positional_draw=name in POSITIONAL_DRAWS)
    assert advantages.abs().sum() > 0  # the toy rewards give a learning signal


@pytest.mark.parametrize("name", sorted(TOKEN_WEIGHT_STRATEGIES))
def test_every_shipped_token_weight_strategy_keeps_the_contract(name):
    weights = check_token_weight_strategy(name, positional_draw=name in POSITIONAL_DRAWS)
    assert weights.sum() > 0


@pytest.mark.parametrize("name", sorted(POSITIONAL_DRAWS))
def test_the_positional_draws_do_break_group_order_draw_for_draw(name):
    """Why they are exempt: checked fully, each fails the group-order check."""
    check = (
        check_advantage_strategy if name in ADVANTAGE_STRATEGIES else check_token_weight_strategy
    )
    with pytest.raises(AssertionError, match="groups in another order"):
        check(name)


# exact_match scores a bare answer only (the toy completions are in TAPO's format): bare
# ones, right and wrong ones for each problem (answers 7 and 3).
BARE_ANSWERS = ("7", " 7\n", "6", "", "3", "3.", "three", "4")


@pytest.mark.parametrize("name", sorted(REWARD_FUNCTIONS))
def test_every_shipped_reward_keeps_the_contract(name):
    bare = name in ("exact_match", "number_format")  # rewards of answers alone
    scores = check_reward(name, completions=BARE_ANSWERS if bare else None)
    assert len(set(scores)) > 1, scores  # the toy completions are told apart


def test_a_plain_function_is_checked_as_its_kind():
    def centred_length(spec, rewards, batch, policy, config):
        length = batch.completion_mask.sum(1)  # (B,)
        groups = length.view(-1, batch.group_size)
        centred = (groups - groups.mean(1, keepdim=True)).view(-1)
        return centred[:, None] * batch.completion_mask

    out = check_advantage_strategy(centred_length)
    assert out.shape == toy_batch().completion_mask.shape


# ---------------------------------------------------------------- each check catches its breach
def _weights(compute, **flags) -> TokenWeightStrategy:
    return TokenWeightStrategy(compute, no_options, **flags)


def test_the_checks_catch_weights_on_padding():
    ones = _weights(
        lambda spec, batch, policy, context: (torch.ones_like(batch.completion_mask), {})
    )
    with pytest.raises(AssertionError, match="not 0 on padding"):
        check_token_weight_strategy(ones, {"name": "ones"})


def test_the_checks_catch_a_wrong_shape_and_nan():
    def per_row(spec, batch, policy, context):
        return batch.completion_mask[:, :1], {}

    with pytest.raises(AssertionError, match=r"shape \(16, 1\), not \(B, T\)"):
        check_token_weight_strategy(_weights(per_row), {"name": "per_row"})

    def nan(spec, batch, policy, context):
        return batch.completion_mask * float("nan"), {}

    with pytest.raises(AssertionError, match="NaN"):
        check_token_weight_strategy(_weights(nan), {"name": "nan"})


def test_the_checks_catch_a_strategy_that_reads_the_row_order():
    def first_rows_count_more(spec, rewards, batch, policy, config):
        return torch.linspace(1, 2, batch.batch_size)[:, None] * batch.completion_mask, {}

    with pytest.raises(AssertionError, match="groups in another order"):
        check_advantage_strategy(first_rows_count_more)


def test_the_checks_catch_unseeded_randomness():
    def random_half(spec, batch, policy, context):
        # Draws from the global generator, not from context.generator: not reproducible.
        return (torch.rand(batch.completion_mask.shape) < 0.5).float() * batch.completion_mask

    with pytest.raises(AssertionError, match="two calls under one seed"):
        check_token_weight_strategy(random_half)


def test_the_checks_catch_a_batch_statistic_that_is_not_gathered():
    def above_batch_mean(spec, batch, policy, context):
        # The mean of this process's tokens only: under data parallelism each process would
        # select by its own mean (ToR gathers through context.accelerator instead).
        mask = batch.completion_mask
        mean = (batch.entropy * mask).sum() / mask.sum()
        return (batch.entropy > mean).float() * mask, {}

    strategy = _weights(above_batch_mean, needs_entropy=True)
    with pytest.raises(AssertionError, match="split across two data-parallel processes"):
        check_token_weight_strategy(strategy, {"name": "above_batch_mean"})


def test_the_checks_catch_entropy_read_without_asking_for_it():
    def high_entropy(spec, batch, policy, context):
        return (batch.entropy > 1).float() * batch.completion_mask, {}

    with pytest.raises(TypeError):  # batch.entropy is None, as the rollout leaves it
        check_token_weight_strategy(high_entropy)
    check_token_weight_strategy(_weights(high_entropy, needs_entropy=True), {"name": "high"})


def test_the_checks_catch_a_reward_that_normalises_over_the_batch():
    def relative_length(completions, **kwargs):
        longest = max(len(c) for c in completions) or 1
        return [len(c) / longest for c in completions]

    with pytest.raises(AssertionError, match="one group at a time"):
        check_reward(relative_length)


def test_the_checks_catch_a_reward_that_changes_between_calls():
    calls = iter(range(1000))

    def counter(completions, **kwargs):
        start = next(calls) * 100
        return [float(start + i) for i in range(len(completions))]

    with pytest.raises(AssertionError, match="two calls"):
        check_reward(counter)


def test_a_trl_reward_reads_the_prompt_table_by_column():
    def right_answer(completions, answer, **kwargs):
        return [float(f"\\boxed{{{a}}}" in c) for c, a in zip(completions, answer, strict=True)]

    # Rows 0 and 4 and 5 box the right answer (7, 3, 3); row 6 boxes 3 for "Anna" too.
    assert check_reward(right_answer) == [1.0, 0, 0, 0, 1.0, 1.0, 1.0, 0]
