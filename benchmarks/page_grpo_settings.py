"""Page-GRPO settings chosen on the validation side of the training logs: the script behind the
tuning table of benchmarks/README.md ("Where the experience-chain defaults come from").

A chain run trains one page-GRPO setting; this trains any number of them and scores each where
the final A/B cannot see it. The training sessions (``query_logs_train``) are split by
``reranker_grpo.validation`` into a fit part and a validation part
(``chain.clicks.logged.validation_split``, the split the fitted click model uses).
The y_aug reranker every setting starts from is pre-trained here, on the fit part's y_aug
targets alone (the chain's own ``reranker_yaug`` saw the validation sessions). Page GRPO trains
on the fit part, with R_old from the click model fitted to the fit part's logs, and each
setting's greedy pages and its pages sampled at the training temperature
are scored on the validation sessions two ways: by an off-policy estimate from the logs alone
(``chain.clicks.off_policy``: doubly robust, the click model fitted to the fit part at the
defaults with no pessimism as its direct method and its position weights as the logging
propensities; columns ``dr_*``), which is what a setting is chosen by (``--select``: the
setting whose greedy pages have the largest estimated clicks + long views), and, as a
diagnostic only, by the simulated users (CTR, long-view and true-quality nDCG@10 change against
the logged order, paired, with standard errors), which read the hidden truth. The held-out A/B sessions
(``query_logs_heldout``) are never loaded: ``TUNING_INPUTS`` is everything this reads, and a
test runs it on a catalog whose held-out logs refuse to load.

    python benchmarks/page_grpo_settings.py \
        --setting "reward.alpha=0.9,reward.beta=0.1" --setting "reward.alpha=1.0,reward.beta=0.0"

Each ``--setting`` is a comma-separated list of ``reranker_grpo`` overrides (dotted keys,
values read as YAML: ``grpo.steps=400,grpo.beta=0.01,reward.r_old=oracle_expected``); no
checkpoint is written.
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.chain.ab_test.simulated_ab import (
    ab_session_metrics,
    simulated_users,
    summarise_ab,
)
from creditflow.chain.clicks.logged import (
    click_model_table,
    fit_click_model,
    validation_split,
)
from creditflow.chain.clicks.off_policy import off_policy_changes, off_policy_feedback
from creditflow.chain.reranker.data import LOGGED, serve_pages
from creditflow.chain.world.catalogue import ClickModel
from creditflow.pipelines.augmented_targets.nodes import build_augmented_targets
from creditflow.pipelines.reranker_grpo.nodes import (
    train_reranker_page_grpo,
)
from creditflow.pipelines.reranker_pretrain.nodes import pretrain_reranker

ROOT = Path(__file__).resolve().parents[1]
# Every dataset the tuning reads: the training side and what the chain built from it.
TUNING_INPUTS = ("query_logs_train", "catalogue_items", "item_experience_scores")
# The off-policy estimate's columns (from the logs alone), then the simulated users'.
OFF_POLICY = {
    "clicks_change": "dr_ctr_change",
    "clicks_change_se": "dr_ctr_change_se",
    "long_views_change": "dr_long_view_change",
    "long_views_change_se": "dr_long_view_change_se",
    "value_change": "dr_value_change",
    "value_change_se": "dr_value_change_se",
}
COLUMNS = [
    *OFF_POLICY.values(),
    "ctr_change_vs_logged",
    "ctr_change_vs_logged_se",
    "long_view_change_vs_logged",
    "long_view_change_vs_logged_se",
    "true_ndcg_at_10_diff_vs_logged",
    "true_ndcg_at_10_diff_vs_logged_se",
]


def overridden(params: dict, setting: str) -> dict:
    """``params`` with the ``key.sub=value,...`` overrides of ``setting`` applied.

    >>> overridden({"reward": {"alpha": 0.5}, "grpo": {"steps": 1}}, "reward.alpha=1,grpo.steps=2")
    {'reward': {'alpha': 1}, 'grpo': {'steps': 2}}
    """
    out = copy.deepcopy(params)
    for item in filter(None, setting.split(",")):
        key, _, text = item.partition("=")
        *path, last = key.strip().split(".")
        node = out
        for part in path:
            node = node[part]
        if last not in node:
            raise KeyError(f"unknown key {key!r}; valid at that level: {sorted(node)}")
        node[last] = yaml.safe_load(text)
    return out


def load_tuning_inputs(load: Any) -> dict[str, Any]:
    """``TUNING_INPUTS`` through ``load`` (a catalog's ``load``), nothing else."""
    return {name: load(name) for name in TUNING_INPUTS}


def pretrained_on_fit_part(
    fit_part: pd.DataFrame,
    items: pd.DataFrame,
    scores: pd.DataFrame,
    pretrain_params: Mapping[str, Any],
) -> Any:
    """The chain's y_aug reranker (``augmented_targets`` + ``reranker_pretrain``, its settings)
    pre-trained on ``fit_part`` alone, so no validation session reaches a setting's start."""
    targets = build_augmented_targets(fit_part, scores)
    model, _ = pretrain_reranker(targets, fit_part, items, scores, None, pretrain_params, "yaug")
    return model


def tune(
    inputs: Mapping[str, Any],
    params: Mapping[str, Any],
    settings: Sequence[str],
    samples: int = 4,
) -> pd.DataFrame:
    """Each setting's page GRPO trained on the fit part and scored on the validation part of
    ``inputs["query_logs_train"]``: the A/B rows (``all`` and ``tail`` bands) of its greedy
    and sampled pages against the logged order, with ``setting``, ``seconds`` and the training
    reward's first / last five steps (``reward_first`` / ``reward_last``)."""
    grpo_defaults = params["reranker_grpo"]
    fit_part, validation = validation_split(inputs["query_logs_train"], grpo_defaults["validation"])
    items, scores = inputs["catalogue_items"], inputs["item_experience_scores"]
    world = ClickModel.from_params(params["annotation"]["click_model"])
    users = simulated_users(validation, items, world)
    start = pretrained_on_fit_part(fit_part, items, scores, params["reranker_pretrain"])
    # The off-policy estimate's click model: the defaults' fit to the fit part, no pessimism.
    estimation_model = fit_click_model(fit_part, items, grpo_defaults)
    long_view_weight = grpo_defaults["reward"]["long_view_weight"]
    rows = []
    for setting in settings or [""]:
        grpo = overridden(grpo_defaults, setting)
        t0 = time.perf_counter()
        # The click model of R_old, fitted to the fit part's own logs (its validation part is
        # then a part of the fit part, never a tuning session).
        click_model = click_model_table(fit_click_model(fit_part, items, grpo))
        model, metrics, _ = train_reranker_page_grpo(
            start,
            fit_part,
            items,
            scores,
            click_model,
            None,
            grpo,
            params["reranker_pretrain"],
            params["annotation"],
        )
        pages = serve_pages(
            validation,
            items,
            scores,
            {"greedy": model},
            {"greedy": "yaug"},
            params["reranker_pretrain"],
            sampled={"sampled": "greedy"},
            temperature=grpo["grpo"]["temperature"],
            samples=samples,
        )
        table = summarise_ab(ab_session_metrics(pages, validation, users, k=10), k=10)
        table = table[(table["ranker"] != LOGGED) & table["band"].isin(["all", "tail"])]
        estimate = off_policy_changes(
            off_policy_feedback(pages, validation, items, estimation_model),
            LOGGED,
            long_view_weight,
        )
        estimate = estimate[estimate["estimator"] == "dr"].rename(columns=OFF_POLICY)
        table = table.merge(estimate[["ranker", *OFF_POLICY.values()]], on="ranker", how="left")
        reward = metrics["reward/page"]
        table.insert(0, "setting", setting or "(defaults)")
        table["seconds"] = time.perf_counter() - t0
        table["reward_first"] = reward.head(5).mean()
        table["reward_last"] = reward.tail(5).mean()
        rows.append(table)
    return pd.concat(rows, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", action="append", default=[], help="reranker_grpo overrides")
    parser.add_argument("--samples", type=int, default=4, help="sampled pages per session")
    parser.add_argument("--out", type=Path, help="write the A/B rows of every setting here (CSV)")
    parser.add_argument(
        "--select",
        action="store_true",
        help="name the setting whose greedy pages have the largest off-policy clicks + long views",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    bootstrap_project(ROOT)
    with KedroSession.create(project_path=ROOT) as session:
        context = session.load_context()
        inputs = load_tuning_inputs(context.catalog.load)
        params = context.params
    table = tune(inputs, params, args.setting, samples=args.samples)
    shown = ["setting", "ranker", "band", *COLUMNS, "seconds", "reward_first", "reward_last"]
    sys.stdout.write(table[shown].round(4).to_string(index=False) + "\n")
    if args.out:
        table.to_csv(args.out, index=False)
    if args.select:
        greedy = table[(table["ranker"] == "greedy") & (table["band"] == "all")]
        best = greedy.loc[greedy["dr_value_change"].idxmax()]
        sys.stdout.write(
            f"selected by the off-policy estimate: {best['setting']} (clicks + long views "
            f"{best['dr_value_change']:+.4f} +- {best['dr_value_change_se']:.4f})\n"
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
