"""A LoRA policy through the ``tapo`` pipeline's real model datasets: the initial policy and
the warm start saved as adapters (safetensors) and read back by the next node, SFT and GRPO
moving only the adapters, the SFT checkpoints holding the adapter only."""

from pathlib import Path

import pytest
import torch
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from creditflow.datasets import CheckpointDirectoryDataset, HFModelDataset
from creditflow.models.lora import ADAPTER_WEIGHTS, is_lora_model
from creditflow.pipelines.tapo import create_pipeline
from creditflow.pipelines.tapo.nodes import train_tapo_policy
from tests.pipelines._params import TAPO_SMALLEST, deep_update, parameter_datasets

pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
EAGER = {"attn_implementation": "eager"}


class KeptMemoryDataset(MemoryDataset):
    """A MemoryDataset the runner cannot release, so the test can read intermediate outputs."""

    def _release(self) -> None:
        pass


def _split(model) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base weights, adapter weights) of a LoRA model, keyed by their names."""
    base, adapter = {}, {}
    for name, parameter in model.named_parameters():
        (adapter if "lora_" in name else base)[name] = parameter.detach().clone()
    return base, adapter


@pytest.mark.slow
def test_a_lora_policy_trains_through_the_catalog(project_root: Path, tmp_path):
    torch.set_num_threads(1)
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    params = deep_update(loader["parameters"]["tapo"], TAPO_SMALLEST)
    params["policy"]["lora"] = LORA  # over the YAML's `lora: null`
    models = {
        stage: HFModelDataset(str(tmp_path / "models" / stage), load_args=EAGER)
        for stage in ("tapo_initial_policy", "tapo_sft_policy")
    }
    pipeline = create_pipeline().to_outputs("tapo_sft_policy")
    datasets = {
        **parameter_datasets("tapo", params),
        "tapo_source_problems": MemoryDataset(None),
        "tapo_sft_checkpoints": CheckpointDirectoryDataset(str(tmp_path / "ckpt")),
        **models,
    }
    for name in pipeline.all_outputs() - set(datasets):
        datasets[name] = KeptMemoryDataset(copy_mode="assign")
    catalog = DataCatalog(datasets)
    SequentialRunner().run(pipeline, catalog)

    for stage in models:
        saved = tmp_path / "models" / stage
        assert (saved / ADAPTER_WEIGHTS).is_file() and (saved / "base").is_dir(), stage
    initial, warm = (models[stage].load() for stage in models)
    assert is_lora_model(initial) and is_lora_model(warm)
    (base0, adapter0), (base1, adapter1) = _split(initial), _split(warm)
    assert all(torch.equal(base1[n], w) for n, w in base0.items())
    assert all(not torch.equal(adapter1[n], w) for n, w in adapter0.items() if "lora_B" in n)
    (run,) = [p for p in (tmp_path / "ckpt").iterdir() if p.is_dir()]
    assert [f.name for f in run.glob("step-*/*.safetensors")] == [ADAPTER_WEIGHTS]

    # The GRPO node reads the warm start back from the catalog and trains its adapters, with
    # the base (adapters disabled) as the KL reference.
    strategy = {**next(iter(params["strategies"].values())), "beta": 0.05}
    tokenizer = catalog.load("tapo_tokenizer")
    tasks = catalog.load("tapo_train_tasks")
    trained, metrics, *_ = train_tapo_policy(warm, tokenizer, tasks, None, params, strategy)
    base2, adapter2 = _split(trained)
    assert all(torch.equal(base2[n], w) for n, w in base0.items())
    assert any(not torch.equal(adapter2[n], w) for n, w in adapter1.items())
    assert len(metrics) == TAPO_SMALLEST["grpo"]["steps"]
