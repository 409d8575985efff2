"""Thin nodes of the ``expmodel_sft`` pipeline; the work happens in creditflow.chain.expmodel."""

from __future__ import annotations

import copy
from typing import Any

import pandas as pd

from creditflow.chain.config import VisionPretraining
from creditflow.chain.expmodel import data as expmodel_data
from creditflow.chain.expmodel import sft as expmodel_sft
from creditflow.chain.expmodel.vision_pretraining import pretrain_vision_tower
from creditflow.chain.world.catalogue import generate_catalogue
from creditflow.config.values import reject_moved_keys
from creditflow.models import (
    ImageOnlyQwen2_5_VLProcessor,
    build_tiny_processor,
    load_policy,
    train_vl_tokenizer,
)
from creditflow.reporting.tables import metrics_frame
from creditflow.training import CheckpointStore
from creditflow.training.supervised import SupervisedConfig
from creditflow.training.threads import torch_threads


def split_expmodel_items(catalogue_items: pd.DataFrame, params: dict[str, Any]) -> pd.DataFrame:
    """The seeded train / unseen split of the catalogue: SFT and PFT read only the train items,
    ``expmodel_evaluation`` reports s_exp on the unseen ones too."""
    split = params["item_split"]
    return expmodel_data.split_items(
        catalogue_items["item_id"].tolist(), split["unseen_fraction"], split["seed"]
    )


def build_expmodel_processor(
    catalogue_items: pd.DataFrame,
    expmodel_annotations: pd.DataFrame,
    expmodel_item_split: pd.DataFrame,
    params: dict[str, Any],
):
    """The ExpModel's processor: a BPE tokenizer trained on the train items' prompts (with
    their queries in query mode) and annotation targets plus the vision tokens, with the image
    processor (tiny model), or a checkpoint's own."""
    model = params["model"]
    if model["source"] != "tiny":
        processor = ImageOnlyQwen2_5_VLProcessor.from_pretrained(model["name_or_path"])
        processor.tokenizer.padding_side = "left"
        return processor
    settings = params["tokenizer"]
    catalogue_items = expmodel_data.items_in_split(
        catalogue_items, expmodel_item_split, expmodel_data.TRAIN
    )
    annotations = expmodel_data.items_in_split(
        expmodel_annotations, expmodel_item_split, expmodel_data.TRAIN
    )
    prompts = expmodel_sft.expmodel_prompts(catalogue_items, annotations)
    ok = expmodel_data.ok_annotations(annotations)
    targets = [expmodel_data.expmodel_target(row) for _, row in ok.iterrows()]
    tokenizer = train_vl_tokenizer(
        prompts + targets, settings["vocab_size"], model_max_length=settings["model_max_length"]
    )
    return build_tiny_processor(tokenizer, image_size=settings["image_size"])


def build_expmodel(expmodel_processor, params: dict[str, Any]):
    """The initial ExpModel: a tiny Qwen2.5-VL from its config, or a pretrained checkpoint."""
    model, _ = load_policy(params["model"], processing_class=expmodel_processor)
    return model


def pretrain_expmodel_vision(
    expmodel_initial_model,
    expmodel_processor,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
) -> tuple[Any, pd.DataFrame]:
    """The initial ExpModel with its vision tower pre-trained to see blur, brightness and
    pixel noise on covers of a catalogue nobody annotated (``vision_pretraining``,
    ``chain.expmodel.vision_pretraining``; resumes from ``checkpoints``); with ``steps: 0``
    the initial model itself."""
    settings = VisionPretraining(**params.get("vision_pretraining", {}))
    if settings.steps == 0:
        return expmodel_initial_model, pd.DataFrame({"step": [], "vision/loss": []})
    image_size = (params.get("tokenizer") or {}).get("image_size", 112)
    covers = generate_catalogue(settings.n_images, seed=settings.seed, image_size=image_size)
    with torch_threads(params.get("torch_threads")):
        model, history = pretrain_vision_tower(
            copy.deepcopy(expmodel_initial_model),
            expmodel_processor.image_processor,
            list(covers["image_png"]),
            settings,
            checkpoints,
        )
    return model, metrics_frame(history)


def train_expmodel_sft(
    expmodel_vision_pretrained_model,
    expmodel_processor,
    catalogue_items: pd.DataFrame,
    expmodel_annotations: pd.DataFrame,
    expmodel_item_split: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
) -> tuple[Any, pd.DataFrame]:
    """docs/methods/experience.md, step 2: SFT a copy of the initial model on the train items' ok annotations (per
    (query, item) in query mode, the query in the prompt; loss on the annotation tokens only);
    returns it and the per-step metrics. A re-run of the same run resumes from (or, finished,
    loads) its checkpoint in ``checkpoints``."""
    reject_moved_keys(params, {"sft": "training (and max_length)"}, "expmodel_sft")
    training = SupervisedConfig.from_params(params["training"], **expmodel_data.EXPMODEL_TRAINING)
    with torch_threads(params.get("torch_threads")):
        model, history = expmodel_sft.train_expmodel_sft(
            copy.deepcopy(expmodel_vision_pretrained_model),
            expmodel_processor,
            expmodel_data.items_in_split(catalogue_items, expmodel_item_split, expmodel_data.TRAIN),
            expmodel_annotations,
            training=training,
            max_length=params["max_length"],
            checkpoints=checkpoints,
        )
    return model, metrics_frame(history)
