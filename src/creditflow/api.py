"""creditflow from Python, outside Kedro: build a policy, configure GRPO, train, evaluate,
export (``export_policy``: the weights and the tokenizer in one folder).

A thin layer over the functions the Kedro nodes call (``models.load_policy``,
``models.train_bpe_tokenizer``, ``training.sft.run_sft``, ``training.grpo_runs.run_grpo``,
``training.evaluation.evaluate_problems``); the tapo pipeline's nodes call these entry
points themselves. A quickstart that runs: docs/python_api.md.

**A dataset** is a pandas DataFrame, a list of dicts or anything with ``to_pandas()`` (a
Hugging Face ``Dataset``), one row per prompt:

- ``prompt``: the user turn the policy sees (the tokenizer's chat template wraps it), or a
  conversation as chat messages ``[{"role": "system", "content": ...}, {"role": "user",
  ...}]``, rendered by the chat template as they are;
- ``answer``: the gold answer, read by the built-in ``reasoning`` reward;
- ``reference``, or ``question_en`` as in TAPO's problem tables: the reference text, read by
  the built-in ``translation`` reward;
- ``target``: the gold completion, read by the SFT warm start (``sft=``);
- any other column: passed on to callable rewards.

**A reward** is a built-in name (``creditflow.rewards.REWARD_FUNCTIONS``: ``format``,
``translation``, ``reasoning``, ``exact_match``, ``final_number``, ``number_format``) or a
TRL-style callable ``fn(completions, **kwargs) ->
list[float]`` (itself, or named by its import path ``"package.module:function"`` or an entry
point: ``creditflow.rewards.plugins``), called as TRL calls one: with ``completions`` (B
strings), ``prompts`` and every other column of the dataset by name, one value per
completion. Its metrics are ``reward/<fn.__name__>`` (``reward/<path>`` for a path); which
rewards count in GRPO, and how much, is ``GRPOConfig.rewards``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from creditflow.config.grpo import GRPOConfig
from creditflow.config.policy import TinyQwen2, checked_policy_spec
from creditflow.config.supervised import SFTConfig
from creditflow.errors import ConfigError
from creditflow.models import (
    explain_missing_checkpoint,
    load_policy,
    load_tokenizer,
    train_bpe_tokenizer,
)
from creditflow.models.export import export_policy  # noqa: F401  (part of this API)
from creditflow.reporting.tables import metrics_frame
from creditflow.rewards import REWARD_INPUTS
from creditflow.rewards.plugins import TRLReward, is_builtin_reward
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.evaluation import evaluate_problems
from creditflow.training.grpo_runs import check_grpo_config, run_grpo
from creditflow.training.rewards import BoundRewards, Reward, reward_columns
from creditflow.training.sft import run_sft
from creditflow.training.strategies import RewardMetric

PROMPT, ANSWER, TARGET = "prompt", "answer", "target"
# Where the built-in rewards' references come from, in the order looked for: a dataset of
# one's own says ``reference``; TAPO's problem tables call theirs ``question_en``.
REFERENCE_COLUMNS = ("reference", "question_en")
# The dataset column behind each data argument of the built-in rewards (REWARD_INPUTS).
_INPUT_COLUMNS = {"answers": ANSWER, "references": REFERENCE_COLUMNS[0]}
TINY = "tiny"

# A policy: a ``config.policy.PolicySpec`` dict (``{"source": "tiny", "tiny": {...}}``,
# ``{"source": "pretrained", "name_or_path": ...}``), or a Hugging Face id / local directory.
Policy = Mapping[str, Any] | str | os.PathLike
Checkpoints = CheckpointStore | str | os.PathLike | None


@dataclass(frozen=True)
class Trained:
    """What ``train`` and ``train_grpo`` return.

    model: the trained copy of the policy, in eval mode (the model passed in is unchanged).
    metrics: one row per GRPO step: ``step``, ``reward/<name>`` (the batch means),
        ``reward/total``, ``actor/*`` (loss, clip fraction, KL, entropy), ``completion/*``,
        ``time/*``.
    samples: completions logged every ``config.log_samples_every`` steps.
    sft_metrics: one row per SFT step (``step``, ``sft/loss``, ``lr``); None without a warm
        start.
    credit: the credit inspector's rows, one per completion token of the recorded
        completions (``creditflow.training.credit``); empty when ``config.credit_inspector``
        is off.
    """

    model: Any
    metrics: pd.DataFrame
    samples: pd.DataFrame
    sft_metrics: pd.DataFrame | None = None
    credit: pd.DataFrame | None = None


def policy_spec(policy: Policy) -> dict[str, Any]:
    """``policy`` as a ``PolicySpec`` dict: a mapping as it is, a string or path as
    ``{"source": "pretrained", "name_or_path": policy}``."""
    if isinstance(policy, Mapping):
        return dict(policy)
    if isinstance(policy, str | os.PathLike):
        return {"source": "pretrained", "name_or_path": os.fspath(policy)}
    raise ConfigError(
        f"a policy is a spec dict ({{'source': 'tiny', 'tiny': {{...}}}}) or a Hugging Face "
        f"id / local checkpoint directory, got {policy!r}"
    )


def build_tokenizer(policy: Policy, texts: Iterable[str] | None = None, **options: Any):
    """The tokenizer of ``policy``. A tiny policy: a byte-level BPE tokenizer trained on
    ``texts`` (the prompts and targets it will read and write) with ``options``, the keyword
    arguments of ``models.train_bpe_tokenizer`` (``vocab_size``, ``special_tokens``,
    ``model_max_length``, ...). A checkpoint: its own tokenizer (``texts`` and ``options`` are
    not read).

    Raises:
        ValueError: an invalid policy spec (``config.policy.PolicySpec``).
        ConfigError: a tiny policy without ``texts``.
        OSError: a checkpoint that is neither a local directory nor in the cache.
    """
    spec = checked_policy_spec(policy_spec(policy), TinyQwen2)
    if spec.source != TINY:
        with explain_missing_checkpoint(spec.name_or_path):
            return load_tokenizer(spec.name_or_path)
    if texts is None:
        raise ConfigError(
            "a tiny policy's tokenizer is trained on texts: pass texts=... (the prompts and "
            "targets), or build_policy(..., tokenizer=...)"
        )
    return train_bpe_tokenizer(texts, **options)


def build_policy(
    policy: Policy, tokenizer=None, *, texts: Iterable[str] | None = None, **tokenizer_options
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``policy`` (``models.load_policy``), the model in eval mode.

    A tiny Qwen2 (``{"source": "tiny", "tiny": {...build_tiny_qwen2 options...}}``) is built
    from its config with a vocabulary sized from ``tokenizer``, or, without one, from the
    tokenizer ``build_tokenizer(policy, texts, **tokenizer_options)`` trains. A checkpoint (a
    Hugging Face id or local directory, or a ``pretrained`` spec) is loaded with its own
    tokenizer unless ``tokenizer`` is given.

    Raises:
        ValueError, ConfigError, OSError: as ``build_tokenizer`` and ``models.load_policy``.
    """
    spec = policy_spec(policy)
    if tokenizer is None and spec.get("source") == TINY:
        tokenizer = build_tokenizer(spec, texts, **tokenizer_options)
    return load_policy(spec, processing_class=tokenizer)


def grpo_config(**fields: Any) -> GRPOConfig:
    """A validated ``GRPOConfig`` from its fields (each documented on ``GRPOConfig``), the
    strategy included: ``advantage={"name": "tapo", "alpha": 0.5, ...}``,
    ``token_weights={"name": "tor", ...}``. Whether the rewards it names are computed is
    checked by ``train``, which knows them.

    Raises:
        ConfigError: an unknown field, a bad value or strategy option, naming the key.
    """
    config = GRPOConfig.from_params(fields)
    check_grpo_config(config)
    return config


def reward_names(rewards: Sequence[Reward]) -> list[str]:
    """The names ``rewards`` go by (a callable's ``__name__``), checked as training checks
    them (``training.rewards.BoundRewards``): built-in names exist, no name repeats.

    Raises:
        ConfigError / ValueError: naming the reward and the valid ones.
    """
    return list(BoundRewards(rewards, [], []).functions)


def as_dataset(data: Any, rewards: Sequence[Reward] = (), *, sft: bool = False) -> pd.DataFrame:
    """``data`` (module docstring) as a DataFrame with a fresh index, checked for the columns
    ``rewards`` read (``rewards.REWARD_INPUTS``) and, with ``sft``, ``target``.

    Raises:
        ConfigError: not a table, no rows, no ``prompt`` column or a non-text prompt, a
            column a reward or the warm start needs is missing, or both ``reference`` and
            ``question_en`` are there.
    """
    frame = _frame(data)
    if frame.empty or PROMPT not in frame.columns:
        raise ConfigError(
            f"a dataset needs rows and a {PROMPT!r} column, got {len(frame)} rows with "
            f"columns {list(frame.columns)}"
        )
    bad = next((i for i, p in enumerate(frame[PROMPT]) if not _is_prompt(p)), None)
    if bad is not None:
        raise ConfigError(
            f"row {bad}: every {PROMPT!r} must be a string (one user turn) or a list of chat "
            f"messages {{'role': ..., 'content': ...}}, got {frame[PROMPT].iloc[bad]!r}"
        )
    references = [c for c in REFERENCE_COLUMNS if c in frame.columns]
    if len(references) > 1:
        raise ConfigError(
            f"the dataset has both {references}: the built-in translation reward would not "
            "know which is the reference; drop or rename one"
        )
    needed = {TARGET: "the SFT warm start (sft=...)"} if sft else {}
    for reward in (reward for reward in rewards if is_builtin_reward(reward)):
        for argument in REWARD_INPUTS[reward]:
            needed.setdefault(_INPUT_COLUMNS[argument], f"the {reward!r} reward")
    for name, reward in BoundRewards(rewards, [], []).functions.items():
        if isinstance(reward, TRLReward):  # its required arguments are columns
            for column in reward.missing_columns(frame.columns):
                needed.setdefault(column, f"the {name!r} reward")
    for column, why in needed.items():
        if (column == REFERENCE_COLUMNS[0] and references) or column in frame.columns:
            continue
        also = f" (or {REFERENCE_COLUMNS[1]!r})" if column == REFERENCE_COLUMNS[0] else ""
        raise ConfigError(
            f"the dataset has no {column!r} column{also}, which {why} reads; its columns are "
            f"{list(frame.columns)}"
        )
    return frame


def warm_start(
    model,
    tokenizer,
    dataset: Any,
    sft: Mapping[str, Any] | SFTConfig,
    checkpoints: Checkpoints = None,
) -> tuple[Any, pd.DataFrame]:
    """SFT on the dataset's ``prompt`` -> ``target`` pairs (``training.sft.run_sft``) so the
    policy can produce the format before RL: ``(trained copy, metrics: one row per step)``.
    ``sft``: ``SFTConfig`` or its fields; ``{"steps": 0}`` passes the model through.
    ``checkpoints``: a ``CheckpointStore`` or folder; a finished run with the same weights,
    data, tokenizer and config is loaded from it, not retrained."""
    params = asdict(sft) if isinstance(sft, SFTConfig) else dict(sft)
    if SFTConfig.from_params(dict(params)).skipped:
        # No training: the model passes through and the dataset is not read (it may be empty).
        model, metrics = run_sft(model, tokenizer, [], [], params, _store(checkpoints))
        return model, metrics_frame(metrics)
    frame = as_dataset(dataset, sft=True)
    model, metrics = run_sft(
        model, tokenizer, frame[PROMPT], frame[TARGET], params, _store(checkpoints)
    )
    return model, metrics_frame(metrics)


def train_grpo(
    model,
    tokenizer,
    dataset: Any,
    rewards: Sequence[Reward],
    config: GRPOConfig,
    *,
    checkpoints: Checkpoints = None,
    distributed: Mapping[str, Any] | None = None,
    reward_metrics: Sequence[RewardMetric] = (),
) -> Trained:
    """GRPO on a copy of ``model`` over the dataset's prompts (``training.grpo_runs.run_grpo``).

    ``checkpoints``: a ``CheckpointStore`` or folder to resume from; its key is the starting
    weights, prompts, references, answers, config and tokenizer, not the code of a callable
    reward nor the other columns it reads (give a changed one a fresh folder).
    ``distributed``: ``{"num_processes": N, "accelerate": {...}}`` (docs/scale_out.md); the
    spawned workers import a callable reward by name, so it must live in a module.
    ``reward_metrics``: extra per-step metrics of the rewards (``GRPOTrainer``).

    Raises:
        ConfigError: a reward the config weights, its strategy reads or it gives options to
            is not in ``rewards``; a column a reward reads is missing (``as_dataset``).
    """
    frame = as_dataset(dataset, rewards)
    check_grpo_config(config, reward_names(rewards))
    reference, answer = _reward_input_columns(frame)
    prompts = list(frame[PROMPT])
    callables = any(not is_builtin_reward(reward) for reward in rewards)
    model, result = run_grpo(
        model,
        tokenizer,
        prompts,
        _values(frame, reference),
        _values(frame, answer),
        config,
        list(rewards),
        _store(checkpoints),
        None if distributed is None else dict(distributed),
        reward_metrics=reward_metrics,
        reward_columns=reward_columns(frame, prompts) if callables else None,
    )
    return Trained(
        model,
        metrics_frame(result.history),
        pd.DataFrame(result.samples),
        credit=pd.DataFrame(result.credit),
    )


def train(
    model,
    tokenizer,
    dataset: Any,
    rewards: Sequence[Reward],
    config: GRPOConfig,
    *,
    sft: Mapping[str, Any] | SFTConfig | None = None,
    checkpoints: Checkpoints = None,
    distributed: Mapping[str, Any] | None = None,
    reward_metrics: Sequence[RewardMetric] = (),
) -> Trained:
    """An optional SFT warm start (``sft``: ``warm_start``; the dataset then needs
    ``target``), then GRPO under ``config`` with ``rewards`` (``train_grpo``), both on copies:
    the model passed in is unchanged. The config and the dataset are checked before the warm
    start. Returns the trained model and the tables (``Trained``)."""
    frame = as_dataset(dataset, rewards, sft=sft is not None)
    check_grpo_config(config, reward_names(rewards))
    sft_metrics = None
    if sft is not None:
        model, sft_metrics = warm_start(model, tokenizer, frame, sft, checkpoints)
    trained = train_grpo(
        model,
        tokenizer,
        frame,
        rewards,
        config,
        checkpoints=checkpoints,
        distributed=distributed,
        reward_metrics=reward_metrics,
    )
    return replace(trained, sft_metrics=sft_metrics)


def evaluate(
    model,
    tokenizer,
    dataset: Any,
    rewards: Sequence[Reward],
    *,
    max_new_tokens: int = GRPOConfig.default("max_new_tokens"),
    batch_size: int = 32,
    samples_per_problem: int = 0,
    sampled_rows: Sequence[bool] | None = None,
    temperature: float = GRPOConfig.default("temperature"),
    top_p: float = GRPOConfig.default("top_p"),
    seed: int = 0,
) -> pd.DataFrame:
    """The dataset with each prompt's greedy ``completion`` and its ``reward/<name>``
    columns (``training.evaluation.evaluate_problems``). With ``samples_per_problem`` >
    0, the rows where ``sampled_rows`` is True (all when None) also get
    ``sampled/reward/<name>``: the mean reward of that many completions sampled at
    ``temperature`` / ``top_p``, the distribution GRPO trains, from draws seeded by ``seed``
    (two policies evaluated with one seed share their random numbers)."""
    frame = as_dataset(dataset, rewards)
    reference, answer = _reward_input_columns(frame)
    return evaluate_problems(
        model,
        tokenizer,
        frame,
        list(frame[PROMPT]),
        list(rewards),
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        samples_per_problem=samples_per_problem,
        sampled_rows=sampled_rows,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        reference_column=reference,
        answer_column=answer,
    )


def _is_prompt(prompt: Any) -> bool:
    """Text, or a non-empty list of ``{"role": str, "content": str}`` messages."""
    if isinstance(prompt, str):
        return True
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(
            isinstance(m, Mapping)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in prompt
        )
    )


def _frame(data: Any) -> pd.DataFrame:
    if isinstance(data, pd.DataFrame):
        return data.reset_index(drop=True)
    if hasattr(data, "to_pandas"):  # a Hugging Face Dataset
        return data.to_pandas().reset_index(drop=True)
    if isinstance(data, Sequence) and all(isinstance(row, Mapping) for row in data):
        return pd.DataFrame(list(data))
    raise ConfigError(
        f"a dataset is a DataFrame, a list of dicts or a Hugging Face Dataset, got "
        f"{type(data).__name__}"
    )


def _reward_input_columns(frame: pd.DataFrame) -> tuple[str | None, str | None]:
    """``(reference column, answer column)`` of a checked dataset, None where it has none
    (``as_dataset`` made sure no reward reads it)."""
    reference = next((c for c in REFERENCE_COLUMNS if c in frame.columns), None)
    return reference, ANSWER if ANSWER in frame.columns else None


def _values(frame: pd.DataFrame, column: str | None) -> list[Any]:
    return [None] * len(frame) if column is None else list(frame[column])


def _store(checkpoints: Checkpoints) -> CheckpointStore | None:
    if checkpoints is None or isinstance(checkpoints, CheckpointStore):
        return checkpoints
    return CheckpointStore(Path(checkpoints))
