"""Parameter helpers shared by the pipeline tests: a nested merge of overrides into the
project's parameters, the smallest tiny decoder (tapo and tor tests) and the smallest
``tapo`` sizes (used by tests/pipelines/tapo and tests/test_reproducibility.py, so the two
cannot drift apart)."""

from __future__ import annotations

import copy


def deep_update(base: dict, overrides: dict) -> dict:
    """A copy of ``base`` with ``overrides`` merged in at every level of nesting (a key
    ``base`` lacks is added, as Kedro's soft merge of conf/local adds it)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = deep_update(out[key], value) if nested else value
    return out


# The smallest tiny decoder (``policy.tiny``) the tapo and tor pipeline tests build.
SMALLEST_TINY_DECODER = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}

# The smallest ``params:tapo`` that still runs every node of the pipeline.
TAPO_SMALLEST = {
    "tasks": {"n_train_per_language": 6, "n_eval_per_language": 2},
    "tokenizer": {"vocab_size": 300},
    "policy": {"tiny": dict(SMALLEST_TINY_DECODER)},
    "sft": {"steps": 3, "batch_size": 4, "warmup_steps": 1, "max_length": 1024},
    "grpo": {
        "steps": 2,
        "prompts_per_step": 2,
        "group_size": 2,
        "max_new_tokens": 10,
        "checkpoint_every": 1,
    },
    "evaluation": {
        "max_new_tokens": 10,
        "batch_size": 16,
        "mgsm_max_per_language": 1,
        "samples_per_problem": 2,
    },
}


def parameter_datasets(group: str, params: dict) -> dict:
    """MemoryDatasets of ``params:<group>`` and of every nested key (``params:<group>.a.b``),
    as a Kedro session registers them: the namespaced strategy nodes read
    ``params:<group>.strategies.<name>``."""
    from kedro.io import MemoryDataset  # noqa: PLC0415 - keep this module import-light

    datasets = {}

    def add(name: str, value) -> None:
        datasets[name] = MemoryDataset(value)
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{name}.{key}", inner)

    add(f"params:{group}", params)
    return datasets
