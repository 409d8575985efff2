"""The schema of every parameter group (``conf/base/parameters_<group>.yml``), checked by
:class:`creditflow.hooks.parameter_check.ParameterCheckHook` before a run's first node, and
the schemas of the ``tapo`` and ``tor`` groups.

A block says which keys exist, their types and ranges; where a typed config already
documents a block (``GRPOConfig``, ``SFTConfig``, ``SupervisedConfig``, ``PolicySpec``,
``PFTOptions``, ``RerankerConfig``, ``IngestConfig``) the block is built from it and runs its
checks, and where a node passes options straight to a function (``preference_pairs``,
``movielens_sessions``) the function's signature is the schema. The knobs themselves are
documented in the YAML files and those configs, not here.

No schema imports torch or transformers: a misspelt ``--params`` key fails in seconds, before
they or the pipelines load. The ``tapo``, ``tor`` and ``grpo`` schemas live here (on
:mod:`.parameter_blocks`); the other groups' schemas (:mod:`.chain_parameters`) are built from
the experience chain's configs and option signatures (pandas and the annotation clients'
modules), which :func:`schema_of` imports only when one of those groups is checked. What
needs torch is asked before the first node only: whether this machine has a policy's
``device``, whether page-level GRPO's strategies exist.

The tapo / tor strategies are checked twice over: their keys here (a strategy's overrides
are a partial ``grpo`` block), and the merged config of every strategy a run trains by
``pipelines.comparison.check_strategies`` (strategy options, rewards that exist).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from creditflow.config.schema import (
    PROBLEMS_HEADER,
    Block,
    Count,
    NonNegative,
    OpenFraction,
    problems,
)
from creditflow.errors import ConfigError
from creditflow.pipelines.credit_gym_parameters import CreditGymParams
from creditflow.pipelines.parameter_blocks import (
    SFT,
    ComparisonGRPO,
    RewardName,
    StrategyComparison,
    StrategyOverrides,
    TextPolicy,
    Threads,
    VisionPolicy,
    check_baseline,
    one_of,
)
from creditflow.tasks.prompts import PROMPT_KINDS
from creditflow.tasks.tapo import ALL_LANGUAGES, OPERATIONS, VARIANTS
from creditflow.tasks.tor import TOR_KINDS

# --- tapo ------------------------------------------------------------------------------------


class TaskSourceFields(Block):
    """``tasks.source`` (``synthetic`` or a catalog dataset's name, which
    ``hooks.task_source.TaskSourceHook`` checks against the catalog) and how a catalog source is
    split (``creditflow.tasks.splits.split_by_problem_id``)."""

    source: Annotated[str, Field(min_length=1)]
    heldout_fraction: OpenFraction
    split_seed: int
    max_train_problems: Count | None
    max_eval_problems: Count | None


class TapoTasks(TaskSourceFields):
    languages: list[one_of(ALL_LANGUAGES, "language")] = Field(min_length=1)
    holdout_languages: list[str] = []
    n_train_per_language: Count
    n_eval_per_language: Count
    max_operand: Count
    operations: list[one_of(OPERATIONS, "operation")] = Field(min_length=1)
    variant: one_of(VARIANTS, "variant") = "standard"

    @model_validator(mode="after")
    def _holdout_is_a_language(self) -> TapoTasks:
        outside = sorted(set(self.holdout_languages) - set(self.languages))
        if outside:
            raise ValueError(f"holdout_languages {outside} are not in languages")
        if not set(self.languages) - set(self.holdout_languages):
            raise ValueError("every language is held out: nothing is left to train on")
        return self


class TapoTokenizer(Block):
    vocab_size: Count
    special_tokens: list[str] = []
    model_max_length: Count


class TapoEvaluation(Block):
    max_new_tokens: Count
    batch_size: Count
    mgsm_max_per_language: NonNegative
    samples_per_problem: NonNegative = 0


class TapoParams(Block):
    seed: int
    torch_threads: Threads = None
    tasks: TapoTasks
    tokenizer: TapoTokenizer
    policy: TextPolicy
    sft: SFT
    reward_functions: list[RewardName] = Field(min_length=1)
    grpo: ComparisonGRPO
    strategies: dict[str, StrategyOverrides | None] = Field(min_length=1)
    comparison: StrategyComparison
    evaluation: TapoEvaluation

    @model_validator(mode="after")
    def _baseline_is_a_strategy(self) -> TapoParams:
        check_baseline("tapo", self.comparison, self.strategies)
        return self


# --- tor -------------------------------------------------------------------------------------


class TorTasks(TaskSourceFields):
    n_train: Count
    n_eval: Count
    image_size: Annotated[int, Field(ge=28)]  # two 14-px patches a side at least
    kinds: list[one_of(TOR_KINDS, "problem kind")] = Field(min_length=1)
    max_number: Annotated[int, Field(ge=2)]
    max_count: Annotated[int, Field(ge=1, le=7)]  # two asked kinds + a distractor in 16 cells
    max_bar: Annotated[int, Field(ge=2, le=10)]  # the bar chart's axis runs 0..10
    single_fraction: Annotated[float, Field(ge=0.0, le=1.0)]


class TorTokenizer(Block):
    vocab_size: Count
    model_max_length: Count


class TorEvaluation(Block):
    max_new_tokens: Count
    batch_size: Count
    tabmwp_max: NonNegative
    mathvision_max: NonNegative
    samples_per_problem: NonNegative = 0


class TorKeptMiB(Block):
    prompts: NonNegative = 3072
    vit_states: NonNegative = 1024


class TorParams(Block):
    seed: int
    torch_threads: Threads = None
    train_vision_encoder: bool
    kept_mib: TorKeptMiB = TorKeptMiB()
    tasks: TorTasks
    tokenizer: TorTokenizer
    policy: VisionPolicy
    sft: SFT
    reward_functions: list[RewardName] = Field(min_length=1)
    grpo: ComparisonGRPO
    strategies: dict[str, StrategyOverrides | None] = Field(min_length=1)
    comparison: StrategyComparison
    evaluation: TorEvaluation

    @model_validator(mode="after")
    def _baseline_is_a_strategy(self) -> TorParams:
        check_baseline("tor", self.comparison, self.strategies)
        return self


# --- grpo: any prompt set ---------------------------------------------------------------------


class GrpoTasks(TaskSourceFields):
    sft_target: Annotated[str, Field(min_length=1)] = "completion"
    n_train: Count
    n_eval: Count
    kinds: list[one_of(PROMPT_KINDS, "prompt kind")] = Field(min_length=1)
    max_operand: Count
    word_length: Count


class GrpoTokenizer(Block):
    vocab_size: Count
    special_tokens: list[str] = []
    model_max_length: Count


class GrpoEvaluation(Block):
    max_new_tokens: Count
    batch_size: Count
    samples_per_problem: NonNegative = 0
    reward_weights: dict[str, float] | None = None


class GrpoParams(Block):
    seed: int
    torch_threads: Threads = None
    tasks: GrpoTasks
    tokenizer: GrpoTokenizer
    policy: TextPolicy
    sft: SFT
    reward_functions: list[RewardName] = Field(min_length=1)
    grpo: ComparisonGRPO
    strategies: dict[str, StrategyOverrides | None] = Field(min_length=1)
    comparison: StrategyComparison
    evaluation: GrpoEvaluation

    @model_validator(mode="after")
    def _baseline_and_weights(self) -> GrpoParams:
        check_baseline("grpo", self.comparison, self.strategies)
        weights = self.evaluation.reward_weights or {}
        unknown = sorted(set(weights) - set(self.reward_functions))
        if unknown:
            raise ValueError(
                f"evaluation.reward_weights names {unknown}, which are not computed; "
                f"reward_functions: {self.reward_functions}"
            )
        return self


# The groups whose schemas live in .chain_parameters (the experience chain and data ingest).
CHAIN_GROUPS = frozenset(
    {
        "annotation",
        "data_ingest",
        "experience_scoring",
        "expmodel_pft",
        "expmodel_sft",
        "movielens_eval",
        "reranker_eval",
        "reranker_grpo",
        "reranker_pretrain",
    }
)
COMPARISON_SCHEMAS: Mapping[str, type[Block]] = {
    "tapo": TapoParams,
    "tor": TorParams,
    "grpo": GrpoParams,
}
# Groups of other pipelines whose schema lives beside them (torch-free modules).
OTHER_SCHEMAS: Mapping[str, type[Block]] = {"credit_gym": CreditGymParams}
GROUPS = frozenset(COMPARISON_SCHEMAS) | CHAIN_GROUPS | frozenset(OTHER_SCHEMAS)


def schema_of(group: str) -> type[Block] | None:
    """The schema of parameter group ``group``, None for a group without one."""
    if group in COMPARISON_SCHEMAS:
        return COMPARISON_SCHEMAS[group]
    if group in OTHER_SCHEMAS:
        return OTHER_SCHEMAS[group]
    if group not in CHAIN_GROUPS:
        return None
    # Imported here, only when a chain group is checked: its configs and option signatures
    # bring pandas and the annotation clients (about a second), which a tapo / tor run's
    # check need not wait for.
    from creditflow.pipelines.chain_parameters import CHAIN_SCHEMAS  # noqa: PLC0415

    return CHAIN_SCHEMAS[group]


def all_schemas() -> dict[str, type[Block]]:
    """Every group's schema (the parameter reference, the tests)."""
    return {group: schema_of(group) for group in sorted(GROUPS)}


def check_parameters(
    groups: Mapping[str, Any],
    *,
    check_device: Callable[[str], Any] | None = None,
    validate_strategies: Callable[[Any], Any] | None = None,
) -> None:
    """Every group of ``groups`` (name -> its ``params:<name>`` dict) against its schema;
    all problems of all groups in one ConfigError. A group without a schema is an error too:
    its keys could not be checked.

    Args:
        check_device: asks whether this machine has a policy's ``device``
            (``models.builders.resolve_device``, torch); None checks the name's form only.
        validate_strategies: checks the advantage and token-weight strategies of a
            ``GRPOConfig`` (``training.strategies.validate_strategies``, torch), for
            ``reranker_grpo.grpo``; None leaves them to a later check.
    """
    context = {"check_device": check_device, "validate_strategies": validate_strategies}
    found = []
    for group, params in groups.items():
        schema = schema_of(group)
        if schema is not None:
            found += problems(group, params, schema, context=context)
        else:
            found.append(f"{group}: no schema in creditflow.pipelines.parameters.GROUPS")
    if found:
        raise ConfigError(PROBLEMS_HEADER + "\n  ".join(found))
