"""The schemas of the experience chain's parameter groups and of ``data_ingest``, looked up
through :func:`creditflow.pipelines.parameters.schema_of`. Built from the torch-free homes of
the chain's configs, name tables and option signatures (``chain.config``,
``chain.expmodel.data``, ``annotation.options``, ``annotation.ratings``, the task
worlds): pandas, no torch or transformers, so a misspelt key of a chain group fails before
torch loads, as one of a comparison does. Whether page-level GRPO's strategies exist (torch)
is asked before the first node only (:class:`PageGRPO`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, model_validator

from creditflow.chain.annotation.options import ANNOTATOR_OPTIONS
from creditflow.chain.annotation.ratings import rating_annotations
from creditflow.chain.config import (
    AB_METHODS,
    FEATURE_NAMES,
    GAIN_MODES,
    PRETRAIN_TRAINING,
    R_OLD_SOURCES,
    RERANKERS,
    RerankerConfig,
    VisionPretraining,
    page_grpo_config,
)
from creditflow.chain.expmodel.data import (
    EXPMODEL_TRAINING,
    SCORE_MODES,
    PFTOptions,
    catalogue_pairs,
    preference_pairs,
)
from creditflow.chain.world.catalogue import ClickModel, LoggingRanker
from creditflow.chain.world.movielens import movielens_item_texts, movielens_sessions
from creditflow.config.grpo import GRPOConfig
from creditflow.config.policy import TinyQwen2_5VL
from creditflow.config.schema import (
    Block,
    Count,
    OpenFraction,
    dataclass_block,
    signature_block,
)
from creditflow.config.task_sources import SYNTHETIC
from creditflow.config.values import checked_options
from creditflow.ingest.config import IngestConfig
from creditflow.pipelines.parameter_blocks import (
    SFT,
    TextPolicy,
    Threads,
    one_of,
    policy_block,
    supervised_block,
)
from creditflow.redaction import is_secret_key


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
    name: one_of(ANNOTATOR_OPTIONS, "annotator")
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
        checked_options(options, ANNOTATOR_OPTIONS[self.name], f"{self.name} annotator")
        # The annotator's own checks (deadlines and reply cap > 0, prompt placeholders ...),
        # now rather than in the node: building one loads and sends nothing (the hf one's
        # options stand in for it: annotation.options).
        try:
            ANNOTATOR_OPTIONS[self.name](**options)
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


ExpmodelTraining = supervised_block("ExpmodelTraining", EXPMODEL_TRAINING)
# The experience model trains all its weights or a chosen few (creditflow.chain), and no
# node moves it off the CPU the catalog loads it on: no lora or device here.
ExpmodelModel = policy_block("ExpmodelModel", TinyQwen2_5VL, without=("device", "lora"))


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
    vision_pretraining: dataclass_block(VisionPretraining, name="VisionPretraining") | None = None


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


class ShuffledExpControl(Block):
    seed: int


class RerankerPretrainControls(Block):
    shuffled_exp: ShuffledExpControl


class RerankerPretrainParams(Block):
    features: RerankerFeatures
    model: dataclass_block(
        RerankerConfig,
        exclude=("n_features",),
        check=lambda values: RerankerConfig(n_features=1, **values),
        name="RerankerArchitecture",
    )
    model_seed: int
    training: supervised_block("RerankerTraining", PRETRAIN_TRAINING)
    rerankers: dict[str, RerankerKind]
    controls: RerankerPretrainControls

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


class PageGRPO(dataclass_block(GRPOConfig, check=_check_page_grpo, name="PageGRPOKeys")):
    """``reranker_grpo.grpo``. Whether its advantage and token-weight strategies exist and take
    their options is asked only when the validation context names a ``validate_strategies``
    (``check_parameters`` before a run's first node: the strategies are torch modules)."""

    @model_validator(mode="after")
    def _strategies_exist(self, info: ValidationInfo) -> PageGRPO:
        validate = (info.context or {}).get("validate_strategies")
        if validate is not None:
            validate(page_grpo_config(self.model_dump(exclude_unset=True), n_candidates=1))
        return self


class PageRewardWeights(Block):
    alpha: float
    beta: float
    k: Count
    gain_mode: one_of(GAIN_MODES, "gain mode")
    r_old: one_of(R_OLD_SOURCES, "r_old source")
    long_view_weight: Annotated[float, Field(ge=0.0)]
    pessimism: Annotated[float, Field(ge=0.0)] = 0.0
    feedback_seed: int
    online_user_budget: Count | None


class ValidationSplit(Block):
    fraction: OpenFraction
    seed: int


class ClickModelEffects(Block):
    item: Annotated[float, Field(ge=0.0)] = 0.0
    query_item: Annotated[float, Field(ge=0.0)] = 0.0


class LoggedClickModelFit(Block):
    l2: Annotated[float, Field(ge=0.0)]
    max_iter: Count
    effects: ClickModelEffects = ClickModelEffects()
    item_logged_rank_pseudo_count: Annotated[float, Field(ge=0.0)] | None = None
    cv_folds: Annotated[int, Field(ge=0)] = 0


class ROldOnlyControl(Block):
    """``reranker_grpo.controls.r_old_only``: the reward weights of the control trained on
    R_old alone; a beta other than 0 would make it no control of the experience term."""

    alpha: Annotated[float, Field(gt=0.0)]
    beta: float

    @model_validator(mode="after")
    def _no_experience_term(self) -> ROldOnlyControl:
        if self.beta != 0.0:
            raise ValueError(
                f"beta is {self.beta}: the r_old_only control is R_old alone, so its beta must "
                "be 0 (the method's mix is reranker_grpo.reward)"
            )
        return self


class RerankerGRPOControls(Block):
    r_old_only: ROldOnlyControl


class ClickModelOverrides(Block):
    """What an R_old variant changes of ``reranker_grpo.click_model`` (its fit's knobs)."""

    l2: Annotated[float, Field(ge=0.0)] | None = None
    max_iter: Count | None = None
    effects: ClickModelEffects | None = None
    item_logged_rank_pseudo_count: Annotated[float, Field(ge=0.0)] | None = None
    cv_folds: Annotated[int, Field(ge=0)] | None = None


class ROldVariant(Block):
    """``reranker_grpo.r_old_variants.<name>``: page GRPO trained like the method's but for
    where its R_old comes from; a key left out keeps the method's value."""

    r_old: one_of(R_OLD_SOURCES, "r_old source") | None = None
    pessimism: Annotated[float, Field(ge=0.0)] | None = None
    click_model: ClickModelOverrides | None = None


class RerankerGRPOParams(Block):
    reward: PageRewardWeights
    validation: ValidationSplit
    click_model: LoggedClickModelFit
    grpo: PageGRPO
    controls: RerankerGRPOControls
    r_old_variants: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")], ROldVariant] = {}


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
    """The text-only ExpModel of ``movielens_eval`` (chain.expmodel.text)."""

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


CHAIN_SCHEMAS: Mapping[str, type[Block]] = {
    "annotation": AnnotationParams,
    "data_ingest": DataIngestParams,
    "experience_scoring": ExperienceScoringParams,
    "expmodel_pft": ExpmodelPFTParams,
    "expmodel_sft": ExpmodelSFTParams,
    "movielens_eval": MovielensEvalParams,
    "reranker_eval": RerankerEvalParams,
    "reranker_grpo": RerankerGRPOParams,
    "reranker_pretrain": RerankerPretrainParams,
}
