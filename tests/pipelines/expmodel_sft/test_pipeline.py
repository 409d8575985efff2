"""Kedro slice test of the ``expmodel_sft`` pipeline at the smallest sizes."""

import io

import pytest
import torch
from kedro.runner import SequentialRunner
from PIL import Image

from creditflow.chain.expmodel.data import expmodel_prompt
from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.errors import ConfigError
from creditflow.models import vl_prompt_inputs
from creditflow.pipelines.expmodel_sft import create_pipeline
from tests.pipelines._experience_chain import (
    chain_catalog,
    deep_update,
    slice_catalog,
    smallest_params,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_expmodel_sft_trains_a_copy_of_the_initial_model(tmp_path):
    params = smallest_params()
    pipeline = create_pipeline()
    catalog = slice_catalog(pipeline, params)
    catalog["expmodel_sft_checkpoints"] = CheckpointDirectoryDataset(str(tmp_path))
    SequentialRunner().run(
        pipeline.only_nodes(
            "split_expmodel_items",
            "build_expmodel_processor",
            "build_expmodel",
            "pretrain_expmodel_vision",
        ),
        catalog,
    )
    initial = _state(catalog.load("expmodel_initial_model"))
    SequentialRunner().run(pipeline.only_nodes("train_expmodel_sft"), catalog)

    metrics = catalog.load("expmodel_sft_metrics")
    assert metrics["step"].tolist() == [1, 2] and metrics["step"].dtype == "int64"
    assert metrics["sft/loss"].map(float).between(0, 50).all()
    assert (metrics["sft/target_tokens"] > 0).all()
    sft = catalog.load("expmodel_sft_model").state_dict()
    # The node trains a copy: the initial model it read is unchanged, the SFT'd one is not.
    after = catalog.load("expmodel_initial_model").state_dict()
    assert all(torch.equal(after[k], initial[k]) for k in initial)
    assert [k for k in initial if not torch.equal(sft[k], initial[k])]

    # The file-backed chain built the same processor and wrote a model that loads back.
    upstream = chain_catalog()
    processor = catalog.load("expmodel_processor")
    saved_processor = upstream.load("expmodel_processor")
    item = catalog.load("catalogue_items").iloc[0]
    prompt = [expmodel_prompt(item["category"], item["title"])]
    image = [Image.open(io.BytesIO(item["image_png"])).convert("RGB")]
    encoded = vl_prompt_inputs(processor, prompt, image)
    reloaded = vl_prompt_inputs(saved_processor, prompt, image)
    assert encoded.keys() == reloaded.keys()
    assert all(torch.equal(encoded[key], reloaded[key]) for key in encoded)
    # image_size 28 = 2 patches of 14 a side, merged 2 x 2 into one image token.
    assert encoded["image_grid_thw"].tolist() == [[1, 2, 2]]
    saved = upstream.load("expmodel_sft_model")
    assert set(saved.state_dict()) == set(sft)

    # A re-run of the same run loads its final checkpoint instead of training again.
    (run_dir,) = tmp_path.iterdir()
    # The final checkpoint beside the run's lock (training.checkpoint.LOCK_FILE).
    assert [p.name for p in sorted(run_dir.iterdir())] == [".lock", "step-000002"]
    SequentialRunner().run(pipeline.only_nodes("train_expmodel_sft"), catalog)
    again = catalog.load("expmodel_sft_model").state_dict()
    assert all(torch.equal(again[k], sft[k]) for k in sft)
    assert catalog.load("expmodel_sft_metrics").equals(metrics)


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"lr": 0.1}, "`lr` is now `learning_rate`"),
        ({"steps": "abc"}, "`steps` must be int"),
        ({"max_length": 64}, r"unknown supervised key `max_length`; valid keys are \['steps'"),
    ],
)
def test_train_expmodel_sft_rejects_a_broken_training_block(tmp_path, training, message):
    params = deep_update(smallest_params(), {"expmodel_sft": {"training": training}})
    pipeline = create_pipeline().only_nodes("train_expmodel_sft")
    catalog = slice_catalog(pipeline, params)
    catalog["expmodel_sft_checkpoints"] = CheckpointDirectoryDataset(str(tmp_path))
    with pytest.raises(ConfigError, match=message):
        SequentialRunner().run(pipeline, catalog)
    assert list(tmp_path.iterdir()) == []  # it failed before anything trained


def test_an_old_sft_block_is_a_clear_error_not_ignored(tmp_path):
    # Before session 5 the block was expmodel_sft.sft; an override of it must not be dropped.
    params = smallest_params()
    params["expmodel_sft"]["sft"] = {"steps": 5}
    pipeline = create_pipeline().only_nodes("train_expmodel_sft")
    catalog = slice_catalog(pipeline, params)
    catalog["expmodel_sft_checkpoints"] = CheckpointDirectoryDataset(str(tmp_path))
    with pytest.raises(ConfigError, match=r"expmodel_sft.sft is now expmodel_sft.training"):
        SequentialRunner().run(pipeline, catalog)
