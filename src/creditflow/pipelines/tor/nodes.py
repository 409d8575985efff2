"""Thin nodes of the ``tor`` pipeline; the work happens in creditflow.tasks/models/training."""

from __future__ import annotations

import logging
import re
import string
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from PIL import Image

from creditflow.ingest.source_rows import visual_problems
from creditflow.models import (
    ImageOnlyQwen2_5_VLProcessor,
    build_tiny_processor,
    explain_missing_checkpoint,
    freeze_vision_encoder,
    load_policy,
    to_policy_device,
    train_vl_tokenizer,
)
from creditflow.pipelines.comparison import labelled_tables
from creditflow.pipelines.tor.report import summarise_tor_runs, tor_intervals
from creditflow.reporting.tables import (
    comparison_text,
    metrics_frame,
    plot_reward_curves,
    summarise_over_seeds,
    summarise_per_seed,
)
from creditflow.tasks.splits import (
    SYNTHETIC,
    evaluation_label,
    split_by_problem_id,
    split_options,
)
from creditflow.tasks.tor import format_tor_target, generate_tor_problems, tor_prompt
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.evaluation import evaluate_problems
from creditflow.training.grpo_runs import run_grpo, strategy_config
from creditflow.training.rewards import reward_columns
from creditflow.training.sft import run_sft
from creditflow.training.threads import torch_threads

logger = logging.getLogger(__name__)

# MATH-Vision questions point at their figure with "<image1>"; the image is the prompt's own.
_IMAGE_TAG = re.compile(r"\s*<image\d*>\s*")
# The real evaluation sets the evaluation node reads, by their label in the result tables:
# with one of those tables as tor.tasks.source, its held-out rows are the set's evaluation.
BENCHMARKS = {"tabmwp": "tabmwp_problems", "mathvision": "mathvision_problems"}


def build_tor_tasks(
    tor_source_problems: pd.DataFrame | None, params: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Training and evaluation problems from ``tasks.source``. ``synthetic``: seeded visual
    problems, a training set and a held-out evaluation set (another seed, with any picture
    that also occurs in training dropped). A catalog dataset (``tor_source_problems``, put
    there by ``hooks.task_source.TaskSourceHook``): its rows checked against the visual schema,
    questions worded as the policy reads them (``choice_question``), split by problem id."""
    tasks = params["tasks"]
    if tasks["source"] == SYNTHETIC:
        return _synthetic_tasks(params)
    problems = visual_problems(tor_source_problems, tasks["source"])
    problems["question"] = _policy_questions(problems)
    return split_by_problem_id(problems, **split_options(tasks))


def train_tor_processor(tor_train_tasks: pd.DataFrame, params: dict[str, Any]):
    """The processor: a BPE tokenizer trained on the task text plus the vision tokens, with the
    image processor (tiny policy), or the checkpoint's own processor."""
    policy = params["policy"]
    if policy["source"] != "tiny":
        with explain_missing_checkpoint(policy["name_or_path"]):
            processor = ImageOnlyQwen2_5_VLProcessor.from_pretrained(policy["name_or_path"])
        processor.tokenizer.padding_side = "left"
        return processor
    settings = params["tokenizer"]
    texts = [tor_prompt(q) for q in tor_train_tasks["question"]] + _sft_targets(tor_train_tasks)
    tokenizer = train_vl_tokenizer(
        texts, settings["vocab_size"], model_max_length=settings["model_max_length"]
    )
    return build_tiny_processor(tokenizer, image_size=params["tasks"]["image_size"])


def build_tor_policy(tor_processor, params: dict[str, Any]):
    """The initial policy: a tiny Qwen2.5-VL from its config, or a pretrained checkpoint."""
    model, _ = load_policy(params["policy"], processing_class=tor_processor)
    return model


def warm_start_tor_policy(
    tor_initial_policy,
    tor_processor,
    tor_train_tasks: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
):
    """SFT on gold reasoning + boxed answers, so the policy answers in the format before RL;
    resumes from ``checkpoints`` (a finished run with the same inputs is loaded)."""
    with torch_threads(params["torch_threads"]):
        model, metrics = run_sft(
            _trainable_policy(tor_initial_policy, params),
            tor_processor,
            _train_prompts(tor_train_tasks),
            _sft_targets(tor_train_tasks),
            params["sft"],
            checkpoints,
            cache_bytes=_cache_bytes(params),
        )
    return model, metrics_frame(metrics)


def train_tor_policy(
    tor_sft_policy,
    tor_processor,
    tor_train_tasks: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
    strategy: dict[str, Any],
):
    """One GRPO run from the warm start with one token-weight strategy (``strategy``: its
    overrides of ``params['grpo']``, seed included)."""
    config, distributed = strategy_config(params, strategy)
    prompts = _train_prompts(tor_train_tasks)
    with torch_threads(params["torch_threads"]):
        model, result = run_grpo(
            _trainable_policy(tor_sft_policy, params),
            tor_processor,
            prompts,
            list(tor_train_tasks["question"]),
            list(tor_train_tasks["answer"]),
            config,
            params["reward_functions"],
            checkpoints,
            distributed,
            reward_columns=reward_columns(tor_train_tasks, prompts),
            cache_bytes=_cache_bytes(params),
        )
    samples, credit = pd.DataFrame(result.samples), pd.DataFrame(result.credit)
    return model, metrics_frame(result.history), samples, credit


def evaluate_tor_policy(
    model,
    tor_processor,
    tor_eval_tasks: pd.DataFrame,
    tabmwp_problems: pd.DataFrame,
    mathvision_problems: pd.DataFrame,
    params: dict[str, Any],
) -> pd.DataFrame:
    """Greedy answers on the held-out problems of ``tasks.source`` (``dataset``: its label,
    ``synthetic`` or the source's name), TabMWP (question + table image) and MATH-Vision
    testmini (choices in the prompt, letters compared through the boxed answer), the real sets
    capped; one row per problem. With ``tabmwp_problems`` or ``mathvision_problems`` as the
    source its held-out rows are that set's evaluation: no other row of it is evaluated (the
    rest were trained on). The source's rows also get ``sampled/reward/<name>``: the mean
    over ``evaluation.samples_per_problem`` completions sampled as GRPO samples (temperature
    and top_p of ``tor.grpo``), from one seed (``params['seed']``) every policy shares, so
    that policies' samples share their random numbers (0: greedy only)."""
    evaluation = params["evaluation"]
    label = evaluation_label(params["tasks"]["source"], BENCHMARKS)
    problems, prompts = _evaluation_problems(
        tor_eval_tasks, label, tabmwp_problems, mathvision_problems, evaluation
    )
    with torch_threads(params["torch_threads"]):
        return evaluate_problems(
            to_policy_device(model, params["policy"]),
            tor_processor,
            problems,
            prompts,
            params["reward_functions"],
            reference_column="prompt",
            max_new_tokens=evaluation["max_new_tokens"],
            batch_size=evaluation["batch_size"],
            sampled_rows=problems["dataset"] == label,
            cache_bytes=_cache_bytes(params),
            **_sampling_options(params),
        )


def _sampling_options(params: dict[str, Any]) -> dict[str, Any]:
    """How the evaluation samples: ``evaluation.samples_per_problem`` completions a problem at
    GRPO's temperature and top_p, from the run's seed."""
    sampling = params["grpo"]
    return {
        "samples_per_problem": params["evaluation"].get("samples_per_problem", 0),
        "temperature": sampling.get("temperature", 1.0),
        "top_p": sampling.get("top_p", 1.0),
        "seed": params["seed"],
    }


def compare_tor_strategies(
    params: dict[str, Any], tor_results_sft: pd.DataFrame, **tables: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, Figure]:
    """The comparison table over seeds, the per-seed table and the reward curves (mean over
    seeds and a +-1 s.e. band). ``tables``: ``results/<strategy>`` and ``metrics/<strategy>``
    of every strategy.

    Per seed (``report.summarise_tor_runs``): accuracy per evaluation set, token-selection
    statistics, step time. Over seeds: their means, and 95 % intervals of the accuracy's gain
    over the warm start and difference to ``comparison.baseline`` on the held-out problems of
    ``tasks.source`` (``report.tor_intervals``)."""
    evaluations, metrics = labelled_tables(params["strategies"], tor_results_sft, tables)
    label = evaluation_label(params["tasks"]["source"], BENCHMARKS)
    per_seed = summarise_per_seed(evaluations, metrics, summarise_tor_runs)
    intervals = tor_intervals(evaluations, label, params["comparison"]["baseline"])
    table = summarise_over_seeds(per_seed, intervals)
    logger.info(
        "ToR comparison (every column: tor_comparison.csv):\n%s",
        comparison_text(table, params["comparison"]["baseline"]),
    )
    curves = ["reward/total", "tor/selected_frac", "actor/entropy", "completion/length"]
    return table, per_seed, plot_reward_curves(metrics, curves)


def choice_question(question: str, choices: list[str]) -> str:
    """A visual question as the policy reads it: image tags dropped and, for multiple choice,
    the options listed by letter with an instruction to answer with the letter.

    >>> choice_question("Which one?\\n<image1>", ["A", "B", "C"])
    'Which one?\\nChoices: A, B, C. Answer with the letter of the correct choice.'
    >>> choice_question("Which is larger?", ["$1$", "$2$"])
    'Which is larger?\\nChoices: (A) $1$ (B) $2$. Answer with the letter of the correct choice.'
    """
    text = _IMAGE_TAG.sub(" ", question).strip()
    if not len(choices):
        return text
    letters = string.ascii_uppercase[: len(choices)]
    if list(choices) == list(letters):  # the options are drawn in the picture
        listed = ", ".join(letters)
    else:
        listed = " ".join(f"({letter}) {c}" for letter, c in zip(letters, choices, strict=True))
    return f"{text}\nChoices: {listed}. Answer with the letter of the correct choice."


def _evaluation_problems(
    tasks: pd.DataFrame,
    label: str,
    tabmwp: pd.DataFrame,
    mathvision: pd.DataFrame,
    evaluation: dict[str, Any],
) -> tuple[pd.DataFrame, list[tuple[str, bytes | Image.Image]]]:
    """The evaluation table (dataset, id, prompt text, answer) and its (text, image) prompts:
    the task rows labelled ``label``, then each real set that is not the task source."""
    real = [
        _real_problems(frame, dataset, evaluation[f"{dataset}_max"])
        for dataset, frame in (("tabmwp", tabmwp), ("mathvision", mathvision))
        if dataset != label
    ]
    tasks = tasks.assign(dataset=label, prompt=tasks["question"])
    columns = ["dataset", "id", "prompt", "answer"]
    problems = pd.concat([tasks[columns], *(r[columns] for r in real)], ignore_index=True)
    images = _task_images(tasks) + [_image(p) for r in real for p in r["image_path"]]
    prompts = [
        (tor_prompt(text), image) for text, image in zip(problems["prompt"], images, strict=True)
    ]
    return problems, prompts


def _real_problems(problems: pd.DataFrame, dataset: str, cap: int) -> pd.DataFrame:
    head = problems.head(cap)
    return head.assign(dataset=dataset, prompt=_policy_questions(head))


def _image(image: bytes | str) -> bytes | Image.Image:
    """PNG bytes stay as they are; an image path is opened."""
    if isinstance(image, bytes):
        return image
    with Image.open(image) as opened:
        return opened.convert("RGB")


def _train_prompts(tasks: pd.DataFrame) -> list[tuple[str, bytes | Image.Image]]:
    images = _task_images(tasks)
    return [(tor_prompt(q), image) for q, image in zip(tasks["question"], images, strict=True)]


def _task_images(tasks: pd.DataFrame) -> list[bytes | Image.Image]:
    """The pictures of task rows: synthetic rows carry PNG bytes (``image_png``), a catalog
    source's rows a file (``image_path``)."""
    if "image_png" in tasks:
        return list(tasks["image_png"])
    return [_image(path) for path in tasks["image_path"]]


def _cache_bytes(params: dict[str, Any]) -> dict[str, int]:
    """The policy's cache budgets (``VisionLanguagePolicy``'s keyword arguments) from
    ``tor.kept_mib`` (MiB); a budget not given keeps the policy's default."""
    kept = params.get("kept_mib") or {}
    names = {"prompts": "prompt_cache_bytes", "vit_states": "vision_cache_bytes"}
    return {names[key]: int(mib * 2**20) for key, mib in kept.items() if key in names}


def _trainable_policy(model, params: dict[str, Any]):
    """The policy on its device, its vision encoder frozen unless ``train_vision_encoder``
    (the catalog loads every weight trainable, so each training node sets it again)."""
    model = to_policy_device(model, params["policy"])
    return model if params["train_vision_encoder"] else freeze_vision_encoder(model)


def _synthetic_tasks(params: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    tasks = params["tasks"]
    knobs = ("image_size", "kinds", "max_number", "max_count", "max_bar", "single_fraction")
    common = {knob: tasks[knob] for knob in knobs}
    train = generate_tor_problems(tasks["n_train"], seed=params["seed"], **common)
    evaluation = generate_tor_problems(tasks["n_eval"], seed=params["seed"] + 10_000, **common)
    evaluation = evaluation[~evaluation["spec"].isin(set(train["spec"]))]
    return train, evaluation.reset_index(drop=True)


def _policy_questions(problems: pd.DataFrame) -> list[str]:
    return [
        choice_question(q, list(c))
        for q, c in zip(problems["question"], problems["choices"], strict=True)
    ]


def _sft_targets(tasks: pd.DataFrame) -> list[str]:
    return [
        format_tor_target(r, a) for r, a in zip(tasks["reasoning"], tasks["answer"], strict=True)
    ]
