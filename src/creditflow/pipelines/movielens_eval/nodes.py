"""Thin nodes of the ``movielens_eval`` pipeline; the work happens in creditflow.tasks/training."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow.chain.ab_test.reporting import (
    paired_gains_by_band,
    plot_metrics_by_band,
    summarise_rankers_by_band,
    teacher_agreement,
)
from creditflow.chain.annotation.ratings import rating_annotations
from creditflow.chain.expmodel import data as expmodel_data
from creditflow.chain.expmodel import pft as expmodel_pft
from creditflow.chain.expmodel import text as text_expmodel
from creditflow.chain.expmodel.scorer import ExpScorer
from creditflow.chain.reranker.data import (
    evaluate_pages,
    named_rerankers,
    reranker_setting,
    serve_pages,
)
from creditflow.chain.reranker.model import PointerReranker
from creditflow.chain.reranker.training import EVALUATION_METRICS
from creditflow.chain.world.movielens import (
    movielens_item_texts,
    movielens_sessions,
    without_held_back,
)
from creditflow.config.values import checked_options
from creditflow.models import load_policy, train_bpe_tokenizer
from creditflow.reporting.tables import metrics_frame
from creditflow.training.sft import run_sft
from creditflow.training.supervised import SupervisedConfig
from creditflow.training.threads import torch_threads

logger = logging.getLogger(__name__)

# The rerankers evaluated on MovieLens (name -> the reranker_pretrain setting of its inputs).
MOVIELENS_RERANKERS = {
    "click_pretrained": "click",
    "yaug_pretrained": "yaug",
    "yaug_page_grpo": "yaug",
}
# The name of a reranker's rows when it reads zero s_exp features instead of the text-only
# ExpModel's scores: the same model, so the difference of the two rows is the effect of s_exp.
ZERO_SCORES = "_zero_s_exp"


def build_movielens_sessions(
    movielens_ratings: pd.DataFrame, movielens_items: pd.DataFrame, params: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One ranking session per user (held-back rated movies plus unrated negatives, a
    popularity-ordered logged page) and the item table the reranker features read."""
    options = checked_options(
        params["sessions"],
        movielens_sessions,
        "movielens_eval.sessions",
        taken=("ratings", "items"),
    )
    return movielens_sessions(movielens_ratings, movielens_items, **options)


def build_movielens_item_texts(
    movielens_items: pd.DataFrame,
    movielens_tags: pd.DataFrame,
    movielens_sessions: pd.DataFrame,
    params: dict[str, Any],
) -> pd.DataFrame:
    """Title, year, genres and most frequent tags of every movie: the text-only ExpModel's
    input. Tags of a held-back (user, movie) are dropped, as its rating is."""
    tags = without_held_back(movielens_tags, movielens_sessions)
    return movielens_item_texts(movielens_items, tags, **params["expmodel"]["item_text"])


def annotate_movielens_items(
    movielens_item_texts: pd.DataFrame,
    movielens_ratings: pd.DataFrame,
    movielens_sessions: pd.DataFrame,
    params: dict[str, Any],
) -> pd.DataFrame:
    """The rating teacher's analysis and overall score of every movie with enough ratings,
    read from the ratings no session holds back (never an evaluation label)."""
    ratings = without_held_back(movielens_ratings, movielens_sessions)
    return rating_annotations(movielens_item_texts, ratings, **params["expmodel"]["teacher"])


def split_movielens_expmodel_items(
    movielens_item_annotations: pd.DataFrame, params: dict[str, Any]
) -> pd.DataFrame:
    """Seeded train / unseen split of the annotated movies: SFT and PFT read the train ones,
    ``movielens_expmodel_evaluation`` reports the teacher agreement on the unseen ones."""
    split = params["expmodel"]["item_split"]
    ids = movielens_item_annotations["item_id"].tolist()
    return expmodel_data.split_items(ids, split["unseen_fraction"], split["seed"])


def build_movielens_expmodel(
    movielens_item_texts: pd.DataFrame,
    movielens_item_annotations: pd.DataFrame,
    movielens_expmodel_item_split: pd.DataFrame,
    params: dict[str, Any],
) -> tuple[Any, Any]:
    """A BPE tokenizer trained on every movie's prompt and the train movies' targets, and the
    initial text ExpModel (a tiny Qwen2 from its config, or a checkpoint)."""
    settings = params["expmodel"]
    train = expmodel_data.items_in_split(
        movielens_item_annotations, movielens_expmodel_item_split, expmodel_data.TRAIN
    )
    texts = list(text_expmodel.text_expmodel_prompts(movielens_item_texts).values())
    texts += [text_expmodel.text_expmodel_target(row) for row in train.to_dict("records")]
    tokenizer = train_bpe_tokenizer(texts, **settings["tokenizer"])
    model, tokenizer = load_policy(settings["model"], processing_class=tokenizer)
    return tokenizer, model


def train_movielens_expmodel_sft(
    movielens_expmodel_initial_model,
    movielens_expmodel_tokenizer,
    movielens_item_texts: pd.DataFrame,
    movielens_item_annotations: pd.DataFrame,
    movielens_expmodel_item_split: pd.DataFrame,
    params: dict[str, Any],
) -> tuple[Any, pd.DataFrame]:
    """docs/methods/experience.md, step 2 on text: SFT a copy of the initial model to write each train movie's teacher
    annotation from its prompt (loss on the annotation tokens only)."""
    settings = params["expmodel"]
    prompts = text_expmodel.text_expmodel_prompts(movielens_item_texts)
    train = expmodel_data.items_in_split(
        movielens_item_annotations, movielens_expmodel_item_split, expmodel_data.TRAIN
    )
    targets = [text_expmodel.text_expmodel_target(row) for row in train.to_dict("records")]
    with torch_threads(settings["torch_threads"]):
        return run_sft(
            movielens_expmodel_initial_model,
            movielens_expmodel_tokenizer,
            [prompts[i] for i in train["item_id"]],
            targets,
            settings["sft"],
        )


def train_movielens_expmodel_pft(
    movielens_expmodel_sft_model,
    movielens_expmodel_tokenizer,
    movielens_item_texts: pd.DataFrame,
    movielens_item_annotations: pd.DataFrame,
    movielens_expmodel_item_split: pd.DataFrame,
    params: dict[str, Any],
) -> tuple[ExpScorer, pd.DataFrame]:
    """docs/methods/experience.md, step 3 on text: a scalar head on a copy of the SFT'd backbone, trained on ordered
    pairs of train movies whose teacher scores differ by at least the margin."""
    settings = params["expmodel"]
    train = expmodel_data.items_in_split(
        movielens_item_annotations, movielens_expmodel_item_split, expmodel_data.TRAIN
    )
    pairs = expmodel_data.catalogue_pairs(train, **settings["pairs"])
    # from_generator shares the backbone: the copy keeps the SFT model as it was saved.
    scorer = ExpScorer.from_generator(copy.deepcopy(movielens_expmodel_sft_model))
    with torch_threads(settings["torch_threads"]):
        scorer, history, heldout_accuracy = text_expmodel.train_text_expmodel_pft(
            scorer,
            movielens_expmodel_tokenizer,
            text_expmodel.text_expmodel_prompts(movielens_item_texts),
            pairs,
            training=SupervisedConfig.from_params(
                settings["pft_training"], **expmodel_data.EXPMODEL_TRAINING
            ),
            options=expmodel_pft.PFTOptions.from_params(settings["pft"]),
        )
    return scorer, metrics_frame(history).assign(**{"pft/heldout_accuracy": heldout_accuracy})


def score_movielens_items(  # noqa: PLR0913 - the scorer, what it reads, and the scale to match
    movielens_expmodel_scorer: ExpScorer,
    movielens_expmodel_tokenizer,
    movielens_item_texts: pd.DataFrame,
    movielens_item_table: pd.DataFrame,
    movielens_item_annotations: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    params: dict[str, Any],
) -> pd.DataFrame:
    """s_exp of every candidate movie (rated or not, annotated or not) and every annotated one
    from its text alone: ``item_id, s_exp, s_exp_raw``. ``s_exp`` is ``s_exp_raw`` moved to the
    mean and spread of the synthetic chain's scores (``item_experience_scores``): the rerankers
    were trained on those and read the score raw (``text_expmodel.on_reference_scale``)."""
    ids = pd.unique(
        pd.concat([movielens_item_table["item_id"], movielens_item_annotations["item_id"]])
    )
    with torch_threads(params["expmodel"]["torch_threads"]):
        scores = text_expmodel.score_text_items(
            movielens_expmodel_scorer,
            movielens_expmodel_tokenizer,
            text_expmodel.text_expmodel_prompts(movielens_item_texts),
            ids,
            params["expmodel"]["score_batch_size"],
        )
    reference = item_experience_scores["s_exp"].to_numpy()
    matched = text_expmodel.on_reference_scale(scores["s_exp"].to_numpy(), reference)
    return scores.rename(columns={"s_exp": "s_exp_raw"}).assign(s_exp=matched)


def evaluate_movielens_expmodel(
    movielens_item_scores: pd.DataFrame,
    movielens_item_annotations: pd.DataFrame,
    movielens_expmodel_item_split: pd.DataFrame,
) -> pd.DataFrame:
    """Kendall tau of s_exp against the teacher's overall on train and unseen movies."""
    table = teacher_agreement(
        movielens_item_scores, movielens_item_annotations, movielens_expmodel_item_split
    )
    logger.info("text ExpModel against its teacher:\n%s", table.to_string(index=False))
    return table


def evaluate_rerankers_on_movielens(  # noqa: PLR0913 - the three rerankers and what they read
    movielens_sessions: pd.DataFrame,
    movielens_item_table: pd.DataFrame,
    movielens_item_scores: pd.DataFrame,
    reranker_click: PointerReranker,
    reranker_yaug: PointerReranker,
    reranker_page_grpo: PointerReranker,
    params: dict[str, Any],
    pretrain_params: dict[str, Any],
) -> pd.DataFrame:
    """Per MovieLens session and ranker: nDCG@K of the ratings (``true_ndcg``, rating / 5 as
    the gain), of the positive ratings (``click_ndcg``), of the s_exp order (``exp_ndcg``) and
    the top-K share of unrated movies. Rerankers that read s_exp read the text-only
    ExpModel's, and are evaluated a second time on zero score features (``ZERO_SCORES``)."""
    models = named_rerankers(
        reranker_click, reranker_yaug, reranker_page_grpo, names=MOVIELENS_RERANKERS
    )
    args = (movielens_sessions, movielens_item_table)
    pages = serve_pages(*args, movielens_item_scores, models, MOVIELENS_RERANKERS, pretrain_params)
    reading = {
        name: model
        for name, model in models.items()
        if reranker_setting(pretrain_params, MOVIELENS_RERANKERS[name])["use_exp_scores"]
    }
    zero = serve_pages(*args, None, reading, MOVIELENS_RERANKERS, pretrain_params)
    pages |= {name + ZERO_SCORES: zero[name] for name in reading}
    return evaluate_pages(pages, movielens_sessions, movielens_item_scores, k=params["k"])


def summarise_movielens_evaluation(
    movielens_evaluation_sessions: pd.DataFrame,
) -> tuple[pd.DataFrame, Figure, pd.DataFrame]:
    """The MovieLens table (ranker x user band: head, torso, tail, all), its bar plot, and the
    effect of s_exp: each reranker with the ExpModel's scores against itself with zeros,
    paired by session."""
    table = summarise_rankers_by_band(movielens_evaluation_sessions)
    logger.info("reranker evaluation on MovieLens:\n%s", table.to_string(index=False))
    rankers = set(movielens_evaluation_sessions["ranker"])
    references = {n: n + ZERO_SCORES for n in MOVIELENS_RERANKERS if n + ZERO_SCORES in rankers}
    effect = paired_gains_by_band(movielens_evaluation_sessions, references)
    logger.info("effect of s_exp on MovieLens:\n%s", effect.to_string(index=False))
    return table, plot_metrics_by_band(table, EVALUATION_METRICS), effect
