"""The schema of every parameter group (``conf/base/parameters_<group>.yml``), checked by
:class:`creditflow.hooks.parameter_check.ParameterCheckHook` before a run's first node.

``SCHEMAS`` maps a group to its block (:mod:`creditflow.config.schema`). A block says which
keys exist, their types and ranges; where a typed config already documents a block
(``GRPOConfig``, ``SFTConfig``, ``SupervisedConfig``, ``PolicySpec``, ``PFTOptions``,
``RerankerConfig``, ``IngestConfig``) the block is built from it and runs its checks, and
where a node passes options straight to a function (``preference_pairs``,
``movielens_sessions``, the tiny model builders) the function's signature is the schema. The
knobs themselves are documented in the YAML files and those configs, not here.

The tapo / tor strategies are checked twice over: their keys here (a strategy's overrides
are a partial ``grpo`` block), and the merged config of every strategy a run trains by
``pipelines.comparison.check_strategies`` (strategy options, rewards that exist).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, create_model, model_validator

from creditflow.algorithms import GAIN_MODES
from creditflow.annotation import ANNOTATORS
from creditflow.annotation.ratings import rating_annotations
from creditflow.config.schema import (
    PROBLEMS_HEADER,
    Block,
    Count,
    NonNegative,
    OpenFraction,
    dataclass_block,
    problems,
    signature_block,
)
from creditflow.config.values import checked_options
from creditflow.errors import ConfigError
from creditflow.experience.expmodel_data import (
    EXPMODEL_TRAINING,
    SCORE_MODES,
    preference_pairs,
)
from creditflow.experience.expmodel_pft import PFTOptions
from creditflow.experience.page_reward import R_OLD_SOURCES, page_grpo_config
from creditflow.experience.reranker_training import FEATURE_NAMES, PRETRAIN_TRAINING
from creditflow.experience.simulated_ab import AB_METHODS
from creditflow.experience.text_expmodel import catalogue_pairs
from creditflow.ingest.config import IngestConfig
from creditflow.models.builders import (
    PolicySpec,
    build_tiny_qwen2,
    text_policy_spec,
    without_other_source,
)
from creditflow.models.lora import LoraSpec
from creditflow.models.reranker import RerankerConfig
from creditflow.models.vision import build_tiny_qwen2_5_vl, vl_policy_spec
from creditflow.pipelines.reranker_pretrain.pipeline import RERANKERS
from creditflow.redaction import is_secret_key
from creditflow.rewards import REWARD_FUNCTIONS
from creditflow.tasks.movielens import movielens_item_texts, movielens_sessions
from creditflow.tasks.reranking import ClickModel, LoggingRanker
from creditflow.tasks.splits import SYNTHETIC
from creditflow.tasks.tapo import ALL_LANGUAGES, OPERATIONS, VARIANTS
from creditflow.tasks.tor import TOR_KINDS
from creditflow.training.config import GRPOConfig
from creditflow.training.sft import SFTConfig
from creditflow.training.supervised import SupervisedConfig


def one_of(names: Collection[str], what: str) -> Any:
    """A string that must be one of ``names`` (the error lists them)."""

    def check(value: str) -> str:
        if value not in names:
            raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(sorted(names))}")
        return value

    return Annotated[str, AfterValidator(check)]


Threads = Annotated[int, Field(ge=1)] | None
RewardName = one_of(REWARD_FUNCTIONS, "reward")


# --- blocks shared by several groups ---------------------------------------------------------


Lora = dataclass_block(LoraSpec, check=LoraSpec.from_params, name="Lora")


def _policy_block(
    name: str, builder: Any, taken: str, check: Any, without: Collection[str] = ()
) -> type[Block]:
    """The ``PolicySpec`` block, less the keys in ``without``. The keys of the source not
    chosen (base's ``tiny:`` beside an override's ``source: pretrained``) are dropped before
    validation, as ``PolicySpec`` ignores them."""
    tiny = signature_block(builder, taken=(taken,), name=f"{name}Tiny")
    extra = {"tiny": (tiny | None, None), "lora": (Lora | None, None)}
    block = dataclass_block(
        PolicySpec,
        check=check,
        exclude=("tiny", "lora", *without),
        extra_fields={key: spec for key, spec in extra.items() if key not in without},
        name=f"{name}Keys",
    )

    def drop_other_source(data: Any) -> Any:
        return without_other_source(data) if isinstance(data, Mapping) else data

    validators = {"drop_other_source": model_validator(mode="before")(drop_other_source)}
    return create_model(name, __base__=block, __validators__=validators)


TextPolicy = _policy_block("TextPolicy", build_tiny_qwen2, "tokenizer", text_policy_spec)
VisionPolicy = _policy_block(
    "VisionPolicy", build_tiny_qwen2_5_vl, "processor_or_tokenizer", vl_policy_spec
)


class Distributed(Block):
    num_processes: Count = 1
    accelerate: dict[str, Any] | None = None


_DISTRIBUTED = {"distributed": (Distributed | None, None)}
# The shared GRPO budget of a comparison; each strategy's merged config is checked whole by
# comparison.check_strategies.
ComparisonGRPO = dataclass_block(GRPOConfig, extra_fields=_DISTRIBUTED, name="ComparisonGRPO")
StrategyOverrides = dataclass_block(
    GRPOConfig, partial=True, extra_fields=_DISTRIBUTED, name="StrategyOverrides"
)
SFT = dataclass_block(SFTConfig, check=SFTConfig.from_params, name="SFT")


class StrategyComparison(Block):
    """How a comparison's strategies are compared (``<group>.comparison``): GRPO runs per
    strategy (seeds ``grpo.seed + k``, ``pipelines.comparison.seed_overrides``) and the
    strategy the others are compared with."""

    n_seeds: Count
    baseline: Annotated[str, Field(min_length=1)]


def _check_baseline(group: str, comparison: StrategyComparison, strategies: Any) -> None:
    if comparison.baseline not in strategies:
        raise ValueError(
            f"comparison.baseline {comparison.baseline!r} is not a strategy; valid: "
            f"{', '.join(sorted(strategies))} (the {group}.strategies)"
        )


def _supervised(name: str, defaults: Mapping[str, Any]) -> type[Block]:
    return dataclass_block(
        SupervisedConfig,
        check=lambda values: SupervisedConfig.from_params(values, **defaults),
        name=name,
    )


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
    strategies: dict[str, StrategyOverrides] = Field(min_length=1)
    comparison: StrategyComparison
    evaluation: TapoEvaluation

    @model_validator(mode="after")
    def _baseline_is_a_strategy(self) -> TapoParams:
        _check_baseline("tapo", self.comparison, self.strategies)
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


class TorParams(Block):
    seed: int
    torch_threads: Threads = None
    train_vision_encoder: bool
    tasks: TorTasks
    tokenizer: TorTokenizer
    policy: VisionPolicy
    sft: SFT
    reward_functions: list[RewardName] = Field(min_length=1)
    grpo: ComparisonGRPO
    strategies: dict[str, StrategyOverrides] = Field(min_length=1)
    comparison: StrategyComparison
    evaluation: TorEvaluation

    @model_validator(mode="after")
    def _baseline_is_a_strategy(self) -> TorParams:
        _check_baseline("tor", self.comparison, self.strategies)
        return self


# --- the experience chain --------------------------------------------------------------------


class CatalogueItems(Block):
    n_items: Count
    image_size: Annotated[int, Field(ge=32)]
    seed: int


class QueryLogs(Block):
    n_queries: Count
    zipf_exponent: Annotated[float, Field(gt=0.0)]
    n_sessions: Count
    list_length: Annotated[int, Field(ge=2)]
    seed: int
    heldout_fraction: OpenFraction
    split_seed: int


class RankingSource(Block):
    """``annotation.source``: ``synthetic`` or catalog datasets (``hooks.task_source.TaskSourceHook``
    checks the names), for both or for neither: the logs name the catalogue's items."""

    items: Annotated[str, Field(min_length=1)]
    impressions: Annotated[str, Field(min_length=1)]

    @model_validator(mode="after")
    def _both_or_neither(self) -> RankingSource:
        if (self.items == SYNTHETIC) != (self.impressions == SYNTHETIC):
            raise ValueError(
                f"items is {self.items!r} and impressions {self.impressions!r}: the synthetic "
                "logs need the synthetic catalogue and your logs need your catalogue; set both "
                "to synthetic or both to catalog datasets"
            )
        return self


class AnnotatorChoice(Block):
    name: one_of(ANNOTATORS, "annotator")
    options: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _options_fit_the_annotator(self) -> AnnotatorChoice:
        options = dict(self.options or {})
        secrets = sorted(str(key) for key in options if is_secret_key(key))
        if secrets:
            raise ValueError(
                f"options.{secrets[0]}: secrets do not belong in parameters (they are written "
                "to run manifests and MLflow); name an entry of conf/local/credentials.yml "
                "with options.credentials instead (docs/howto/credentials.md)"
            )
        options.pop("credentials", None)  # resolved to the key by the annotation node
        checked_options(options, ANNOTATORS[self.name], f"{self.name} annotator")
        # The annotator's own checks (deadlines and reply cap > 0, prompt placeholders ...),
        # now rather than in the node: building one loads and sends nothing.
        try:
            ANNOTATORS[self.name](**options)
        except (TypeError, ValueError) as error:
            raise ValueError(f"options: {error}") from error
        return self


class AnnotationParams(Block):
    source: RankingSource
    items: CatalogueItems
    query_logs: QueryLogs
    logging_ranker: dataclass_block(LoggingRanker, check=lambda v: LoggingRanker(**v))
    click_model: dataclass_block(ClickModel, check=ClickModel.from_params)
    annotator: AnnotatorChoice


DataIngestParams = dataclass_block(
    IngestConfig, check=IngestConfig.from_params, name="DataIngestParams"
)


class ExperienceScoringParams(Block):
    batch_size: Count


class ExpmodelTokenizer(Block):
    vocab_size: Count
    model_max_length: Count
    image_size: Annotated[int, Field(ge=28)]


ExpmodelTraining = _supervised("ExpmodelTraining", EXPMODEL_TRAINING)
# The experience model trains all its weights or a chosen few (creditflow.experience), and no
# node moves it off the CPU the catalog loads it on: no lora or device here.
ExpmodelModel = _policy_block(
    "ExpmodelModel",
    build_tiny_qwen2_5_vl,
    "processor_or_tokenizer",
    vl_policy_spec,
    without=("device", "lora"),
)


class ExpmodelItemSplit(Block):
    unseen_fraction: Annotated[float, Field(ge=0.0, lt=1.0)]
    seed: int


class ExpmodelSFTParams(Block):
    RENAMED = {"sft": "training (and max_length)"}
    torch_threads: Threads = None
    score_mode: one_of(SCORE_MODES, "score_mode")
    item_split: ExpmodelItemSplit
    tokenizer: ExpmodelTokenizer | None = None  # the tiny model's; a checkpoint brings its own
    model: ExpmodelModel
    training: ExpmodelTraining
    max_length: Count


class ExpmodelPFTParams(Block):
    torch_threads: Threads = None
    pairs: signature_block(
        preference_pairs, taken=("sessions_df", "annotations_df"), name="PreferencePairs"
    )
    training: ExpmodelTraining
    pft: dataclass_block(PFTOptions, check=PFTOptions.from_params, name="PFT")


class RerankerFeatures(Block):
    exclude: list[one_of(FEATURE_NAMES, "feature")] = []


class RerankerKind(Block):
    use_exp_scores: bool


class RerankerPretrainParams(Block):
    features: RerankerFeatures
    model: dataclass_block(
        RerankerConfig,
        exclude=("n_features",),
        check=lambda values: RerankerConfig(n_features=1, **values),
        name="RerankerArchitecture",
    )
    model_seed: int
    training: _supervised("RerankerTraining", PRETRAIN_TRAINING)
    rerankers: dict[str, RerankerKind]

    @model_validator(mode="after")
    def _both_rerankers(self) -> RerankerPretrainParams:
        missing = sorted(set(RERANKERS) - set(self.rerankers))
        if missing:
            raise ValueError(f"rerankers must define {missing} (the pipeline trains each)")
        unused = sorted(set(self.rerankers) - set(RERANKERS))
        if unused:
            raise ValueError(
                f"rerankers {unused} are not trained; the pipeline trains {sorted(RERANKERS)}"
            )
        return self


def _check_page_grpo(values: dict[str, Any]) -> None:
    # n_candidates is the sessions' list length, known only from the data; any value >= 1
    # checks the rest.
    page_grpo_config(values, n_candidates=1)


class PageRewardWeights(Block):
    alpha: float
    beta: float
    k: Count
    gain_mode: one_of(GAIN_MODES, "gain mode")
    r_old: one_of(R_OLD_SOURCES, "r_old source")
    long_view_weight: Annotated[float, Field(ge=0.0)]
    feedback_seed: int
    online_user_budget: Count | None


class ValidationSplit(Block):
    fraction: OpenFraction
    seed: int


class LoggedClickModelFit(Block):
    l2: Annotated[float, Field(ge=0.0)]
    max_iter: Count


class RerankerGRPOParams(Block):
    reward: PageRewardWeights
    validation: ValidationSplit
    click_model: LoggedClickModelFit
    grpo: dataclass_block(GRPOConfig, check=_check_page_grpo, name="PageGRPO")


class SampledPages(Block):
    samples: Count
    seed: int


class QualitySweep(Block):
    quality_weights: list[float] = Field(min_length=1)


class SimulatedAB(Block):
    k: Count
    method: one_of(AB_METHODS, "A/B method")
    draws: Count
    seed: int
    sampled_pages: SampledPages
    sweep: QualitySweep


class RerankerEvalParams(Block):
    k: Count
    ab: SimulatedAB


class MovielensTokenizer(Block):
    vocab_size: Count
    model_max_length: Count


class MovielensExpmodel(Block):
    """The text-only ExpModel of ``movielens_eval`` (experience.text_expmodel)."""

    torch_threads: Threads = None
    item_text: signature_block(movielens_item_texts, taken=("items", "tags"), name="ItemText")
    teacher: signature_block(rating_annotations, taken=("item_texts", "ratings"), name="Teacher")
    item_split: ExpmodelItemSplit
    tokenizer: MovielensTokenizer
    model: TextPolicy
    sft: SFT
    pairs: signature_block(catalogue_pairs, taken=("annotations",), name="CataloguePairs")
    pft_training: ExpmodelTraining
    pft: dataclass_block(PFTOptions, check=PFTOptions.from_params, name="MovielensPFT")
    score_batch_size: Count


class MovielensEvalParams(Block):
    sessions: signature_block(movielens_sessions, taken=("ratings", "items"), name="Sessions")
    k: Count
    expmodel: MovielensExpmodel


SCHEMAS: Mapping[str, type[Block]] = {
    "annotation": AnnotationParams,
    "data_ingest": DataIngestParams,
    "experience_scoring": ExperienceScoringParams,
    "expmodel_pft": ExpmodelPFTParams,
    "expmodel_sft": ExpmodelSFTParams,
    "movielens_eval": MovielensEvalParams,
    "reranker_eval": RerankerEvalParams,
    "reranker_grpo": RerankerGRPOParams,
    "reranker_pretrain": RerankerPretrainParams,
    "tapo": TapoParams,
    "tor": TorParams,
}


def check_parameters(groups: Mapping[str, Any]) -> None:
    """Every group of ``groups`` (name -> its ``params:<name>`` dict) against its schema;
    all problems of all groups in one ConfigError. A group without a schema is an error too:
    its keys could not be checked."""
    found = []
    for group, params in groups.items():
        if group in SCHEMAS:
            found += problems(group, params, SCHEMAS[group])
        else:
            found.append(f"{group}: no schema in creditflow.pipelines.parameters.SCHEMAS")
    if found:
        raise ConfigError(PROBLEMS_HEADER + "\n  ".join(found))
