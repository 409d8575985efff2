"""Page-GRPO settings judged by the simulated online A/B: the script behind README's
alpha / beta table ("The simulated online A/B").

A chain run trains one page-GRPO setting; this trains any number of them from the chain's
saved y_aug reranker (the newest ``reranker_yaug`` and its inputs, through the project's
catalog) and shows each one's greedy pages, and its pages sampled at the training
temperature, to the world's click model on the held-out sessions: CTR, long-view and
true-quality nDCG@10 change against the logged order, paired, with standard errors.

    python benchmarks/page_grpo_settings.py \
        --setting "reward.alpha=0.9,reward.beta=0.1" --setting "reward.alpha=0.5,reward.beta=0.5"

Each ``--setting`` is a comma-separated list of ``reranker_grpo`` overrides (dotted keys,
values read as YAML: ``grpo.steps=400,grpo.beta=0.01,reward.feedback=sampled``); no checkpoint
is written.
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import yaml
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.experience.reranker_data import LOGGED, serve_pages
from creditflow.experience.simulated_ab import (
    ab_session_metrics,
    simulated_users,
    summarise_ab,
)
from creditflow.pipelines.reranker_grpo.nodes import train_reranker_page_grpo
from creditflow.tasks.reranking import ClickModel

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = [
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", action="append", default=[], help="reranker_grpo overrides")
    parser.add_argument("--samples", type=int, default=4, help="sampled pages per session")
    parser.add_argument("--out", type=Path, help="write the A/B rows of every setting here (CSV)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    bootstrap_project(ROOT)
    with KedroSession.create(project_path=ROOT) as session:
        context = session.load_context()
        load, params = context.catalog.load, context.params
        train, heldout = load("query_logs_train"), load("query_logs_heldout")
        items, scores = load("catalogue_items"), load("item_experience_scores")
        start = load("reranker_yaug")
    users = simulated_users(
        heldout, items, ClickModel.from_params(params["annotation"]["click_model"])
    )
    rows = []
    for setting in args.setting or [""]:
        grpo = overridden(params["reranker_grpo"], setting)
        t0 = time.perf_counter()
        model, metrics, _ = train_reranker_page_grpo(
            start,
            train,
            items,
            scores,
            None,
            grpo,
            params["reranker_pretrain"],
            params["annotation"],
        )
        pages = serve_pages(
            heldout,
            items,
            scores,
            {"greedy": model},
            {"greedy": "yaug"},
            params["reranker_pretrain"],
            sampled={"sampled": "greedy"},
            temperature=grpo["grpo"]["temperature"],
            samples=args.samples,
        )
        table = summarise_ab(ab_session_metrics(pages, heldout, users, k=10), k=10)
        table = table[(table["ranker"] != LOGGED) & table["band"].isin(["all", "tail"])]
        table.insert(0, "setting", setting or "(defaults)")
        reward = metrics["reward/page"]
        sys.stdout.write(
            f"{setting or '(defaults)'}: {time.perf_counter() - t0:.0f} s, training reward "
            f"{reward.head(5).mean():.3f} -> {reward.tail(5).mean():.3f}\n"
            f"{table[['ranker', 'band', *COLUMNS]].round(4).to_string(index=False)}\n"
        )
        sys.stdout.flush()
        rows.append(table)
    if args.out:
        pd.concat(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
