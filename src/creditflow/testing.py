"""Contract checks for a strategy or reward of one's own, to call in one's own tests.

Each check runs the strategy or reward on a small synthetic rollout batch (or on completions
you give) and raises ``AssertionError``, saying which part of the contract broke, unless:

- **shapes**: ``(B, T)`` out of a strategy; one score per completion out of a reward;
- **zeros on padding**: a strategy's advantages or weights are exactly 0 where
  ``completion_mask`` is 0;
- **finite values**: no NaN or infinity (a reward may return None: "does not apply");
- **group order**: with the groups of the batch in another order the output is the same,
  its rows moved with them;
- **determinism**: two calls under one seed agree (the engine seeds ``torch`` for the
  advantages and hands token weights a seeded ``WeightContext.generator``);
- **splitting**: the batch split as the engine splits it gives the same result. The engine
  computes advantages and token weights on each data-parallel process's share of whole groups
  (``WeightContext.accelerator`` gathers batch-global statistics), and scores rewards in
  whatever chunks it samples; the loss's micro-batches come later and are exact by
  construction (``GRPOConfig.micro_batch_size``). A strategy is checked on two shares run as
  two simulated processes; a reward on one group at a time. An advantage strategy that
  declares it reads batch-wide statistics (``AdvantageStrategy.batch_statistics``, GDPO's
  batch z-score) is exempt: a run of it with several processes is refused instead.

A strategy whose output is a random draw over batch positions (the controls
``shuffled_advantages`` and ``random_tokens``: docs/methods/controls.md) cannot keep the
group-order and splitting properties draw for draw, only in distribution; pass
``positional_draw=True`` to check it for everything else.

Every shipped strategy and reward passes them (tests/training/test_contracts.py)::

    from creditflow.testing import check_token_weight_strategy
    from my_credit.strategies import HIGH_ENTROPY_ONLY


    def test_my_strategy_keeps_the_contract():
        check_token_weight_strategy(HIGH_ENTROPY_ONLY, {"name": "mine", "fraction": 0.2})

Shape symbols: ``B`` sequences (groups x ``G``), ``G`` group size, ``T`` completion tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from creditflow.config.grpo import GRPOConfig
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.rewards import BoundRewards, Reward
from creditflow.training.strategies import (
    ADVANTAGE_STRATEGIES,
    TOKEN_WEIGHT_STRATEGIES,
    AdvantageStrategy,
    TokenWeightStrategy,
    WeightContext,
)
from creditflow.training.strategies.plugins import as_strategy, plugin_strategy

# The pieces the toy tokenizer decodes ids to: id 0 pads; TAPO's tags so the translation
# segment can be found; digits and words for the rest.
PIECES = ("", "<translation>", "</translation>", " ", "Tom", "has", "3", "4", "7", "+", "=", ".")
PAD, OPEN, CLOSE = 0, 1, 2


class ToyTokenizer:
    """A tokenizer whose id ``i`` decodes to ``PIECES[i]``: what a strategy that reads the
    completions' text (TAPO's translation segment) needs of ``policy.tokenizer``."""

    pad_token_id = PAD

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return "".join(PIECES[i] for i in ids)

    def batch_decode(self, rows: Any, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(row, skip_special_tokens) for row in rows]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """``text`` as the ids of its pieces, longest piece first (HICRA's strategic grams)."""
        ids, rest = [], text
        while rest:
            piece = max((p for p in PIECES[1:] if rest.startswith(p)), key=len, default=None)
            if piece is None:
                raise ValueError(f"the toy tokenizer has no piece for {rest!r}; its: {PIECES}")
            ids.append(PIECES.index(piece))
            rest = rest[len(piece) :]
        return ids


class ToyPolicy:
    """What strategies may ask of the policy: ``tokenizer`` and ``no_image_logprobs`` (ToR's
    log-probs without the image: here 1.5 times the rollout's, so the visual sensitivity is a
    per-token value independent of the batch's layout, and continuous: no ties)."""

    def __init__(self) -> None:
        self.tokenizer = ToyTokenizer()

    def no_image_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        return batch.old_logp * 1.5  # (B, T); 0 on padding, as old_logp


def toy_batch(
    n_groups: int = 4,
    group_size: int = 4,
    width: int = 12,
    seed: int = 0,
    with_entropy: bool = True,
    with_logprobs: bool = True,
) -> RolloutBatch:
    """A synthetic rollout batch: ``n_groups`` prompts x ``group_size`` completions of random
    lengths (one fills ``width``), each opening ``<translation>``, about half closing it;
    ``old_logp`` (B, T) and ``entropy`` (B, T) continuous random values on valid tokens, 0 on
    padding (``old_logp`` empty without ``with_logprobs``, ``entropy`` None without
    ``with_entropy``, as the rollout leaves them when no strategy asks)."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    ids = torch.full((B, width), PAD)
    mask = torch.zeros(B, width)
    lengths = torch.randint(2, width + 1, (B,), generator=g)
    lengths[0] = width
    for row, n in enumerate(lengths.tolist()):
        tokens = torch.randint(3, len(PIECES), (n,), generator=g)
        tokens[0] = OPEN
        if n > 2 and torch.rand((), generator=g) < 0.5:
            tokens[int(torch.randint(1, n - 1, (), generator=g))] = CLOSE
        ids[row, :n] = tokens
        mask[row, :n] = 1.0
    old_logp = -torch.rand(B, width, generator=g) * 3 * mask
    entropy = torch.rand(B, width, generator=g) * 2 * mask
    return RolloutBatch(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=ids,
        completion_mask=mask,
        old_logp=old_logp if with_logprobs else torch.empty(0),
        completion_texts=ToyTokenizer().batch_decode(ids),
        prompt_index=torch.arange(n_groups).repeat_interleave(group_size),
        group_size=group_size,
        entropy=entropy if with_entropy else None,
    )


def toy_rewards(
    batch: RolloutBatch, names: Sequence[str], seed: int = 0
) -> dict[str, torch.Tensor]:
    """name -> (B,) rewards: the first reward in {0, 1} (as the reasoning reward), the others
    in [0, 1]; the first group gets equal rewards (no learning signal) in all of them."""
    g = torch.Generator().manual_seed(seed + 1)
    B, G = batch.batch_size, batch.group_size
    out = {}
    for k, name in enumerate(names):
        values = torch.rand(B, generator=g)
        values = (values > 0.5).float() if k == 0 else values
        values[:G] = values[0]
        out[name] = values
    return out


# ---------------------------------------------------------------- the strategy checks
def check_advantage_strategy(
    strategy: AdvantageStrategy | Callable | str,
    spec: Mapping[str, Any] | None = None,
    *,
    config: GRPOConfig | None = None,
    batch: RolloutBatch | None = None,
    rewards: Mapping[str, torch.Tensor] | None = None,
    policy: Any = None,
    seed: int = 0,
    positional_draw: bool = False,
) -> torch.Tensor:
    """The contract (module docstring) of an advantage strategy; returns its ``(B, T)``
    advantages on ``batch``.

    Args:
        strategy: an ``AdvantageStrategy``, a plain function ``(spec, rewards, batch, policy,
            config)``, or a name (built-in, import path, entry point).
        spec: its spec (``{"name": ..., **options}``); default ``{"name": <its name>}``.
        config: the run's ``GRPOConfig``; default one with ``spec``, G of ``batch`` and
            ``rewards: {reasoning: 1, translation: 1}``.
        batch, rewards, policy: default ``toy_batch()``, ``toy_rewards`` of the config's
            rewards and those the strategy reads, ``ToyPolicy()``.
        positional_draw: the output is a random draw over batch positions: the group-order
            and splitting checks are skipped (module docstring).
    """
    strategy, spec = _strategy("advantage", strategy, spec, ADVANTAGE_STRATEGIES)
    if batch is None:  # the entropy only when the strategy asks for it, as the rollout does
        batch = toy_batch(seed=seed, with_entropy=strategy.needs_entropy(spec), with_logprobs=False)
    config = config or GRPOConfig(
        group_size=batch.group_size,
        advantage=dict(spec),
        rewards={"reasoning": 1.0, "translation": 1.0},
    )
    strategy.validate(spec, config)
    names = list(dict.fromkeys([*config.rewards, *sorted(strategy.reward_names(spec))]))
    rewards = dict(rewards) if rewards is not None else toy_rewards(batch, names, seed)
    policy = policy if policy is not None else ToyPolicy()

    def run(b: RolloutBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        picked = rewards if rows is None else {k: v[rows] for k, v in rewards.items()}
        with torch.random.fork_rng(devices=[]):  # seeded as the engine seeds a step
            torch.manual_seed(seed)
            out, metrics = strategy.compute(spec, picked, b, policy, config)
        _check(isinstance(metrics, Mapping), f"metrics must be a mapping, got {type(metrics)}")
        return out

    out = run(batch)
    _check_tensor("advantages", out, batch)
    _check_equal("two calls under one seed", run(batch), out)
    if positional_draw:
        return out
    rows = _permuted_rows(batch, seed)
    _check_equal("the groups in another order", run(batch.select(rows), rows), out[rows])
    if strategy.batch_statistics(spec):
        return out  # refused with several processes (grpo_runs.check_distributed)
    halves = _halves(batch)
    split = torch.cat([run(batch.select(h), h) for h in halves])
    _check_equal("the batch split into two shares of whole groups", split, out[torch.cat(halves)])
    return out


def check_token_weight_strategy(
    strategy: TokenWeightStrategy | Callable | str,
    spec: Mapping[str, Any] | None = None,
    *,
    config: GRPOConfig | None = None,
    batch: RolloutBatch | None = None,
    policy: Any = None,
    seed: int = 0,
    positional_draw: bool = False,
) -> torch.Tensor:
    """The contract (module docstring) of a token-weight strategy; returns its ``(B, T)``
    weights on ``batch``. Arguments as ``check_advantage_strategy`` (a plain function:
    ``(spec, batch, policy, context)``); the default ``toy_batch`` carries ``entropy`` and
    ``old_logp`` only when the strategy asks for them (``needs_entropy``,
    ``needs_rollout_logprobs``), as the rollout does. The split runs the two shares as two
    processes whose ``context.accelerator`` gathers across them, as under data parallelism."""
    strategy, spec = _strategy("token_weights", strategy, spec, TOKEN_WEIGHT_STRATEGIES)
    batch = (
        batch
        if batch is not None
        else toy_batch(
            seed=seed,
            with_entropy=strategy.needs_entropy,
            with_logprobs=strategy.needs_rollout_logprobs,
        )
    )
    config = config or GRPOConfig(group_size=batch.group_size, token_weights=dict(spec))
    strategy.validate(spec, config)
    policy = policy if policy is not None else ToyPolicy()

    def run(b: RolloutBatch, accelerator: Any = None) -> torch.Tensor:
        context = WeightContext(torch.Generator().manual_seed(seed), accelerator)
        out, metrics = strategy.compute(spec, b, policy, context)
        _check(isinstance(metrics, Mapping), f"metrics must be a mapping, got {type(metrics)}")
        return out

    out = run(batch)
    _check_tensor("weights", out, batch)
    _check_equal("two calls under one seed", run(batch), out)
    if positional_draw:
        return out
    rows = _permuted_rows(batch, seed)
    _check_equal("the groups in another order", run(batch.select(rows)), out[rows])
    halves = _halves(batch)
    shares = _as_processes([batch.select(h) for h in halves], run)
    _check_equal(
        "the batch split across two data-parallel processes",
        torch.cat(shares),
        out[torch.cat(halves)],
    )
    return out


def _strategy(
    label: str, strategy: Any, spec: Mapping[str, Any] | None, table: Mapping
) -> tuple[Any, dict]:
    """``(the strategy dataclass, its spec)`` of a name, a dataclass or a plain function; a
    token-weight strategy with the flags of that spec (``TokenWeightStrategy.for_spec``), as
    the trainer reads them."""
    if isinstance(strategy, str):
        spec = {"name": strategy, **(spec or {})}
        found = table.get(strategy) or plugin_strategy(label, strategy, table)
    else:
        spec = {**(spec or {})}
        spec["name"] = spec.get("name") or getattr(strategy, "__name__", "strategy")
        found = as_strategy(label, strategy, spec["name"])
    return (found.for_spec(spec) if isinstance(found, TokenWeightStrategy) else found), spec


# ---------------------------------------------------------------- the reward check
# Completions in the format of the shipped tasks (2 groups x 4): right and wrong answers,
# closed and unclosed translations, an empty one.
TOY_COMPLETIONS = (
    "<translation>Tom has 3 apples and buys 4.</translation> 3 + 4 = 7. \\boxed{7}",
    "<translation>Tom has 3 apples.</translation> \\boxed{6}",
    "<translation>Tom has",
    "",
    "<translation>Anna has 5 pens and gives 2.</translation> 5 - 2 = 3 \\boxed{3}",
    "<translation>Anna has 5 pens.</translation> \\boxed{3}",
    "\\boxed{3}",
    "<translation>Anna gives 2 pens.</translation> 5 - 2 = 4 \\boxed{4}",
)
TOY_PROBLEMS = {
    "prompt": ["Tom hat 3 Äpfel und kauft 4.", "Anna hat 5 Stifte und gibt 2."],
    "question_en": ["Tom has 3 apples and buys 4.", "Anna has 5 pens and gives 2."],
    "answer": ["7", "3"],
}


def check_reward(
    reward: Reward,
    completions: Sequence[str] | None = None,
    problems: Mapping[str, Sequence[Any]] | None = None,
    group_size: int = 4,
    seed: int = 0,
) -> list[float]:
    """The contract (module docstring) of a reward, called as training calls it
    (``training.rewards.BoundRewards``); returns its scores of ``completions``.

    Args:
        reward: a built-in name, an import path or entry point, or a TRL-style callable.
        completions: ``B`` completions, ``group_size`` per problem in order; default
            ``TOY_COMPLETIONS``.
        problems: the prompt table, column -> one value per problem (``prompt``, and
            ``answer`` / ``question_en`` for the built-in rewards; every column reaches a
            TRL-style reward by name); default ``TOY_PROBLEMS``.
    """
    completions = list(TOY_COMPLETIONS if completions is None else completions)
    problems = {k: list(v) for k, v in (TOY_PROBLEMS if problems is None else problems).items()}
    n_problems = len(next(iter(problems.values())))
    _check(
        len(completions) == n_problems * group_size,
        f"{len(completions)} completions for {n_problems} problems x {group_size}",
    )
    columns = {"prompts": problems.get("prompt", [None] * n_problems)}
    columns |= {k: v for k, v in problems.items() if k != "prompt"}
    scorer = BoundRewards(
        [reward],
        problems.get("question_en", problems.get("reference", [None] * n_problems)),
        problems.get("answer", [None] * n_problems),
        columns=columns,
    )
    (name,) = scorer.functions
    index = torch.arange(n_problems).repeat_interleave(group_size)  # (B,)

    def run(rows: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
            torch.manual_seed(seed)
            return scorer([completions[i] for i in rows.tolist()], index[rows])

    everything = torch.arange(len(completions))
    out = run(everything)
    scores = out[name]
    _check(
        scores.shape == (len(completions),),
        f"{scores.shape[0]} scores for {len(completions)} completions",
    )
    _check(bool(torch.isfinite(scores).all()), f"non-finite scores {scores.tolist()}")
    for flag in (k for k in out if k.startswith(f"{name}/")):
        _check(
            set(out[flag].tolist()) <= {0.0, 1.0}, f"flag {flag} is not 0/1: {out[flag].tolist()}"
        )
    _check_scores_equal("two calls", run(everything), out)
    rows = _permuted_rows_of(n_problems, group_size, seed)
    _check_scores_equal(
        "the groups in another order", run(rows), {k: v[rows] for k, v in out.items()}
    )
    chunks = [run(everything[g * group_size : (g + 1) * group_size]) for g in range(n_problems)]
    joined = {k: torch.cat([c[k] for c in chunks]) for k in out}
    _check_scores_equal("one group at a time", joined, out)
    return scores.tolist()


# ---------------------------------------------------------------- helpers
def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"contract broken: {message}")


def _check_tensor(what: str, out: Any, batch: RolloutBatch) -> None:
    _check(isinstance(out, torch.Tensor), f"{what} must be a tensor, got {type(out).__name__}")
    shape = tuple(batch.completion_mask.shape)
    _check(tuple(out.shape) == shape, f"{what} have shape {tuple(out.shape)}, not (B, T) = {shape}")
    _check(out.is_floating_point(), f"{what} must be floating point, got {out.dtype}")
    _check(bool(torch.isfinite(out).all()), f"{what} hold NaN or infinite values")
    padding = batch.completion_mask == 0
    _check(
        bool((out[padding] == 0).all()),
        f"{what} are not 0 on padding (completion_mask 0): {out[padding][out[padding] != 0][:5].tolist()}",
    )


def _check_equal(case: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    try:
        torch.testing.assert_close(got, expected)
    except AssertionError as error:
        raise AssertionError(f"contract broken: a different result with {case}: {error}") from None


def _check_scores_equal(
    case: str, got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> None:
    _check(
        set(got) == set(expected), f"other outputs with {case}: {sorted(got)} vs {sorted(expected)}"
    )
    for key in expected:
        _check_equal(f"{case} ({key})", got[key], expected[key])


def _permuted_rows(batch: RolloutBatch, seed: int) -> torch.Tensor:
    return _permuted_rows_of(batch.batch_size // batch.group_size, batch.group_size, seed)


def _permuted_rows_of(n_groups: int, group_size: int, seed: int) -> torch.Tensor:
    """(B,) row order with the groups permuted (never the identity for 2+ groups), each group's
    rows kept together and in order."""
    order = torch.randperm(n_groups, generator=torch.Generator().manual_seed(seed + 2))
    if n_groups > 1 and bool((order == torch.arange(n_groups)).all()):
        order = order.roll(1)
    return (order[:, None] * group_size + torch.arange(group_size)).reshape(-1)


def _halves(batch: RolloutBatch) -> list[torch.Tensor]:
    """The rows of the first and of the last half of the groups (the first half has one more
    group when their number is odd)."""
    n_groups = batch.batch_size // batch.group_size
    cut = (n_groups + 1) // 2 * batch.group_size
    rows = torch.arange(batch.batch_size)
    return [rows[:cut], rows[cut:]]


class _Processes:
    """What ``WeightContext.accelerator`` offers a strategy (``num_processes``,
    ``process_index``, ``device``, ``gather``), for processes simulated by threads: ``gather``
    waits for every process's tensor and returns them concatenated in process order."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots: list[Any] = [None] * n

    def member(self, rank: int) -> Any:
        processes = self

        class Member:
            num_processes, process_index, device = processes.n, rank, torch.device("cpu")
            is_main_process = rank == 0

            def gather(self, tensor: torch.Tensor) -> torch.Tensor:
                processes.slots[rank] = tensor
                processes.barrier.wait()
                out = torch.cat(list(processes.slots))
                processes.barrier.wait()  # everyone has read the slots before they are reused
                return out

        return Member()


def _as_processes(
    shares: list[RolloutBatch], run: Callable[..., torch.Tensor]
) -> list[torch.Tensor]:
    """``run(share, accelerator)`` for each share at once, in threads that act as processes."""
    processes = _Processes(len(shares))
    results: list[Any] = [None] * len(shares)

    def work(rank: int) -> None:
        try:
            results[rank] = run(shares[rank], processes.member(rank))
        except BaseException as error:  # re-raised below, in the caller's thread
            results[rank] = error
            processes.barrier.abort()

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(len(shares))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, threading.BrokenBarrierError):
            continue
        if isinstance(result, BaseException):
            raise result
    _check(all(isinstance(r, torch.Tensor) for r in results), "a process failed to gather")
    return results


__all__ = [
    "ToyPolicy",
    "ToyTokenizer",
    "check_advantage_strategy",
    "check_reward",
    "check_token_weight_strategy",
    "toy_batch",
    "toy_rewards",
]
