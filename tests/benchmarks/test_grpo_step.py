"""The GRPO benchmark: its timing arithmetic, the tiny-model builder and one real step of each
implementation run as ``benchmarks/grpo_step.py`` subprocesses (the way ``compare.py`` runs them).
"""

import doctest
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from creditflow.models import load_tokenizer
from creditflow.tasks.tapo import DEFAULT_LANGUAGES

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    # benchmarks/ holds scripts, not a package: import them from their files.
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


grpo_step = _load("grpo_step")
compare = _load("compare")
make_tiny_model = _load("make_tiny_model")
tapo_settings = _load("tapo_settings")

# Smallest sizes that still exercise every code path: B = P * G = 2 * 2 = 4, T = 8.
P, G, T = 2, 2, 8
B = P * G


def _run(*args):
    done = subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# ---------------------------------------------------------------- timing arithmetic
def test_step_clock_durations_run_from_previous_end():
    clock = grpo_step.StepClock(
        started=1.0, ends=[3.0, 4.5, 4.75], cpu_started=0.5, cpu_ends=[1.0, 3.0, 3.5]
    )
    # 3.0 - 1.0 = 2.0, 4.5 - 3.0 = 1.5, 4.75 - 4.5 = 0.25
    assert clock.durations() == [2.0, 1.5, 0.25]
    # 1.0 - 0.5 = 0.5, 3.0 - 1.0 = 2.0, 3.5 - 3.0 = 0.5
    assert clock.cpu_durations() == [0.5, 2.0, 0.5]


def test_step_clock_laps_measure_real_time():
    clock = grpo_step.StepClock()
    clock.start()
    time.sleep(0.02)
    clock.lap()
    (wall,) = clock.durations()
    (cpu,) = clock.cpu_durations()
    assert wall >= 0.02
    assert 0.0 <= cpu < wall  # sleeping costs no CPU time


def test_phase_timer_means_over_the_measured_steps_only():
    timer = grpo_step.PhaseTimer()
    timer.add("generate", 0, 9.0)  # warm-up step, excluded below
    timer.add("generate", 1, 1.0)
    timer.add("generate", 1, 0.5)  # two calls in one step add up: 1.5
    timer.add("generate", 2, 2.5)
    timer.add("reward", 2, 0.25)  # no reward call in step 1 counts as 0
    means = timer.mean_over(range(1, 3))
    # generate: (1.5 + 2.5) / 2 = 2.0; reward: (0 + 0.25) / 2 = 0.125
    assert means == {"generate_s": 2.0, "reward_s": 0.125}


def test_summarize_excludes_warmup_steps_from_wall_time():
    work = grpo_step.Workload(
        model_dir=Path("unused"),
        prompts=["a", "b"],
        answers=["1", "2"],
        group_size=2,
        max_new_tokens=T,
        steps=2,
        warmup_steps=1,
        learning_rate=1e-4,
        seed=0,
        attn_implementation="eager",
    )
    # Wall steps: 10, 2, 3 s; CPU steps: 5, 1, 2 s.
    clock = grpo_step.StepClock(started=0.0, ends=[10.0, 12.0, 15.0], cpu_ends=[5.0, 6.0, 8.0])
    record = grpo_step.summarize(
        "creditflow", work, clock, 0.5, [32.0, 20.0, 30.0], [0.0, 0.5, 1.0], None
    )
    # measured = steps 2 and 3: wall = 2 + 3 = 5 s, tokens = 20 + 30 = 50, 50 / 5 = 10 tok/s
    assert record["wall_s"] == 5.0
    assert record["s_per_step"] == 2.5
    assert record["median_step_s"] == 2.5
    assert record["warmup_s"] == 10.0
    assert record["cpu_s_per_step"] == 1.5  # (1 + 2) / 2
    assert record["completion_tokens"] == 50
    assert record["tokens_per_s"] == 10.0
    assert record["reward_mean"] == 0.75  # (0.5 + 1.0) / 2
    with pytest.raises(RuntimeError, match="expected 3 steps"):
        grpo_step.summarize("trl", work, clock, 0.5, [1.0, 2.0], [0.0, 0.0], None)


def test_compare_reports_medians_and_the_creditflow_over_trl_ratio():
    def record(s_per_step, steps):
        return {
            "s_per_step": s_per_step,
            "median_step_s": s_per_step,
            "cpu_s_per_step": s_per_step / 2,
            "tokens_per_s": 100.0 / s_per_step,
            "peak_rss_mb": 800.0,
            "warmup_s": 1.0,
            "load_s": 0.1,
            "warmup_steps": 1,
            "step_s": [99.0, *steps],  # the warm-up step (99 s) is never pooled
        }

    by_impl = {
        "creditflow": [record(1.0, [1.0]), record(3.0, [3.0]), record(2.0, [2.0])],
        "trl": [record(4.0, [4.0]), record(4.0, [4.0]), record(8.0, [8.0])],
    }
    stats = compare.medians(by_impl["creditflow"])
    assert stats["s_per_step"] == 2.0  # median of 1, 3, 2
    assert stats["pooled_median_step_s"] == 2.0
    table = compare.summary_table(by_impl)
    # creditflow 2.0 s/step, TRL median of 4, 4, 8 = 4.0 s/step: ratio 0.50;
    # tok/s 50 vs 25: ratio 2.00
    ratio_row = table.splitlines()[-1]
    assert ratio_row.startswith("| creditflow / TRL | 0.50 | 0.50 | 0.50 | 2.00 | 1.00 |")
    # tok/s by round: 100 / 25 = 4.00, 33.3 / 25 = 1.33, 50 / 12.5 = 4.00
    assert compare.paired_ratios(by_impl) == (
        "creditflow / trl tok/s by round: 4.00, 1.33, 4.00 (median 4.00)"
    )


def test_compare_labels_become_grpo_step_arguments():
    assert doctest.testmod(compare).failed == 0
    # The label's thread count comes last, so it overrides the shared --threads.
    args, step_args = compare.parse_args(
        ["--model-dir", "m", "--labels", "creditflow@1", "trl@2", "--", "--threads", "4"]
    )
    assert args.impls == ["creditflow@1", "trl@2"] and step_args == ["--threads", "4"]


# ---------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_model")
    _run(
        BENCHMARKS / "make_tiny_model.py",
        "--out", out, "--seed", "0", "--n-problems", "2", "--vocab-size", "300",
        "--hidden-size", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
        "--intermediate-size", "64",
    )  # fmt: skip
    return out


@pytest.mark.slow
def test_make_tiny_model_writes_a_loadable_model_and_interleaved_prompts(tiny_model_dir):
    rows = [json.loads(line) for line in (tiny_model_dir / "prompts.jsonl").open()]
    assert len(rows) == 2 * len(DEFAULT_LANGUAGES)  # 2 problems per language
    assert [r["language"] for r in rows[: len(DEFAULT_LANGUAGES)]] == list(DEFAULT_LANGUAGES)
    assert all(r["answer"].isdigit() and "<translation>" in r["prompt"] for r in rows)
    tokenizer = load_tokenizer(tiny_model_dir)
    assert len(tokenizer.encode("<translation>", add_special_tokens=False)) == 1
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.hidden_size == 32 and model.config.vocab_size == len(tokenizer)


def test_pad_vocab_to_pads_the_tied_embedding_and_keeps_the_tokenizer(tmp_path):
    """--pad-vocab-to N: N embedding rows (the LM head tied to them), the tokenizer's rows
    unchanged, the tokenizer itself unchanged (the benchmark at Qwen2.5's 151,936)."""
    sizes = {
        "n_problems": 1, "vocab_size": 300, "hidden_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32,
    }  # fmt: skip
    plain = make_tiny_model.make_tiny_model(tmp_path / "plain", **sizes)
    padded = make_tiny_model.make_tiny_model(tmp_path / "padded", pad_vocab_to=1000, **sizes)
    tokenizer = load_tokenizer(padded)
    assert len(tokenizer) == len(load_tokenizer(plain)) < 1000
    small, big = (AutoModelForCausalLM.from_pretrained(d) for d in (plain, padded))
    assert big.config.vocab_size == 1000 and big.get_output_embeddings().weight.shape[0] == 1000
    assert big.get_output_embeddings().weight is big.get_input_embeddings().weight
    old = small.get_input_embeddings().weight
    assert torch.equal(big.get_input_embeddings().weight[: len(old)], old)
    with pytest.raises(ValueError, match="below the vocabulary size"):
        make_tiny_model.pad_vocabulary(small, 10, seed=0)


def _check_record(record, impl):
    assert record["impl"] == impl
    assert (record["steps"], record["warmup_steps"]) == (1, 1)
    assert (record["prompts"], record["group_size"], record["max_new_tokens"]) == (P, G, T)
    step_s = record["step_s"]
    assert len(step_s) == 2 and all(s > 0 for s in step_s)
    # Only the second step is timed: the warm-up step is reported apart.
    assert record["wall_s"] == pytest.approx(step_s[1])
    assert record["warmup_s"] == pytest.approx(step_s[0])
    assert record["s_per_step"] == pytest.approx(step_s[1])
    assert 0 < record["cpu_s_per_step"]
    # B completions of 1..T tokens each (the EOS counts as a token).
    assert B <= record["completion_tokens"] <= B * T
    assert record["tokens_per_s"] == pytest.approx(record["completion_tokens"] / record["wall_s"])
    assert 100 < record["peak_rss_mb"] < 8000  # torch alone is a few hundred MB
    assert 0.0 <= record["reward_mean"] <= 1.0
    profile = record["profile"]
    for phase in ("generate_s", "rollout_s", "update_s", "update_forward_s", "reward_s"):
        assert math.isfinite(profile[phase]) and profile[phase] >= 0, phase
    assert profile["generate_s"] <= profile["rollout_s"]
    assert profile["update_forward_s"] <= profile["update_s"]


def _grpo_step(impl, model_dir):
    done = _run(
        BENCHMARKS / "grpo_step.py",
        "--impl", impl, "--model-dir", model_dir, "--group-size", G, "--prompts", P,
        "--max-new-tokens", T, "--steps", 1, "--warmup-steps", 1, "--threads", 1, "--profile",
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must carry only the JSON record, got {lines!r}"
    return json.loads(lines[0])


@pytest.mark.slow
def test_creditflow_run_prints_one_json_record(tiny_model_dir):
    _check_record(_grpo_step("creditflow", tiny_model_dir), "creditflow")


@pytest.mark.slow
def test_trl_run_prints_one_json_record(tiny_model_dir):
    pytest.importorskip("trl")
    _check_record(_grpo_step("trl", tiny_model_dir), "trl")


def test_tapo_settings_reads_set_values_as_yaml_and_exponents_as_floats():
    result = doctest.testmod(tapo_settings)
    assert result.attempted > 0 and result.failed == 0
    parse = tapo_settings.parse_value
    assert parse("1e-3") == pytest.approx(1e-3)  # YAML 1.1 alone would give the string "1e-3"
    assert parse("32") == 32 and parse("true") is True and parse("[1, 2]") == [1, 2]
    assert parse("token-mean") == "token-mean"


def test_tapo_settings_dotted_overrides_reach_the_strategy_the_node_trains():
    from creditflow.training.grpo_runs import merge_overrides  # noqa: PLC0415

    params = yaml.safe_load(tapo_settings.PARAMETERS.read_text())["tapo"]
    tapo_settings.apply_override(params, "tapo", "advantage.scale_by_std", False)
    tapo_settings.apply_override(params, "tapo", "learning_rate", 1e-3)
    trained = merge_overrides(params["grpo"], params["strategies"]["tapo"])
    assert trained["advantage"]["scale_by_std"] is False
    assert trained["advantage"]["alpha"] == 0.5  # the strategy's other settings stay
    assert trained["learning_rate"] == pytest.approx(1e-3)
    assert "scale_by_std" not in params["strategies"]["grpo_sum"]["advantage"]
