"""What s_exp and the reward's source add to page GRPO, paired over ExpModel and GRPO seeds:
the script behind benchmarks/README.md ("What s_exp adds, over seeds") and the README headline.

For every ExpModel seed (a project directory whose catalog holds that seed's chain up to
``item_experience_scores``: ``kedro run --pipelines annotation,expmodel_sft,expmodel_pft,
experience_scoring`` with the seed overrides below) and every GRPO seed, it trains, from the
saved scores and the same logs:

- ``yaug_pretrained``: the y_aug reranker (``augmented_targets`` + ``reranker_pretrain``);
- ``shuffled_yaug_pretrained``: the same from s_exp shuffled within each query (every place
  s_exp enters: the y_aug order, the reranker's score features, page GRPO's y^s);
- ``page_grpo``: page GRPO at the defaults (R_old from the click model fitted to the logs,
  alpha 0.9, beta 0.1);
- ``page_grpo_r_old_only``: the same with alpha 1, beta 0 (no experience term);
- ``page_grpo_with_<name>``: page GRPO on each R_old variant of the chain's
  ``reranker_grpo.r_old_variants`` (``features_only``: the click model on the catalogue's
  features alone; ``pessimistic``: one posterior sd below the estimate; ``oracle``: the
  simulator's exact expectation, which reads the hidden truth, a ceiling and not a method);
- ``shuffled_page_grpo``: page GRPO at the defaults from ``shuffled_yaug_pretrained``.

Their greedy pages of the held-out sessions go to the simulated A/B (exact expectations), and
each (ExpModel seed, GRPO seed) is one unit (with one unit only, ``<out>_sessions_*`` hold its
table paired over the held-out sessions instead, ``summarise_sessions``): per unit the CTR and long-view change against the
logged order (ratio of means - 1) and the true-quality nDCG@10 difference; a contrast is the
difference of two rankers' values within a unit. The table gives the mean over units with a
Student t interval over them (``creditflow.reporting.stats``), and a contrast whose interval
holds 0 its minimum detectable effect. Pretrained rankers do not depend on the GRPO seed; their
contrast is over ExpModel seeds only.

    .venv/bin/python benchmarks/experience_ab_seeds.py --grpo-seeds 0 1 \
        --expmodel-run 0=. --expmodel-run 1=/tmp/seeds/e1 --expmodel-run 2=/tmp/seeds/e2 \
        --out benchmarks/results/experience_ab_seeds

where ``/tmp/seeds/eN`` holds a copy of ``conf/base`` and ``pyproject.toml`` (and an empty
``src/``) in which ran ``kedro run --pipelines annotation,expmodel_sft,expmodel_pft,
experience_scoring --params "expmodel_sft.model.tiny.seed=N,expmodel_sft.training.seed=N,
expmodel_pft.training.seed=N"``. Units already in ``<out>_units.csv`` are skipped, so a run
cut short resumes; runs side by side write their own ``--out`` and one more call with
``--merge A_units.csv B_units.csv`` (and no ``--expmodel-run``) pools them into the table.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.chain.ab_test.controls import (
    METRICS,
    contrast_rows,
    interval_columns,
    session_differences,
    shuffled_scores,
)
from creditflow.chain.ab_test.simulated_ab import (
    CLICKS,
    LONG_VIEWS,
    ab_session_metrics,
    simulated_users,
    true_ndcg_column,
)
from creditflow.chain.clicks.logged import click_model_table, fit_click_model
from creditflow.chain.reranker.data import LOGGED, serve_pages
from creditflow.chain.reranker.page_reward import variant_params
from creditflow.chain.world.catalogue import ClickModel
from creditflow.pipelines.augmented_targets.nodes import build_augmented_targets
from creditflow.pipelines.reranker_grpo.nodes import train_reranker_page_grpo
from creditflow.pipelines.reranker_pretrain.nodes import pretrain_reranker

ROOT = Path(__file__).resolve().parents[1]
K = 10
NDCG = true_ndcg_column(K)
# GRPO runs: name -> (which scores / start, reranker_grpo.reward overrides); each R_old
# variant of the parameters adds page_grpo_with_<name> (VARIANT).
VARIANTS: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "page_grpo": ("real", {}),
    "page_grpo_r_old_only": ("real", {"alpha": 1.0, "beta": 0.0}),
    "shuffled_page_grpo": ("shuffled", {}),
}
VARIANT = "page_grpo_with_"
PRETRAINED = {"yaug_pretrained": "real", "shuffled_yaug_pretrained": "shuffled"}
# (a, b, what a - b measures)
CONTRASTS = (
    ("page_grpo", "page_grpo_r_old_only", "the experience term (beta 0.1 vs 0)"),
    ("page_grpo", "shuffled_page_grpo", "s_exp vs shuffled s_exp, after page GRPO"),
    ("yaug_pretrained", "shuffled_yaug_pretrained", "s_exp vs shuffled s_exp, y_aug alone"),
    ("page_grpo_with_oracle", "page_grpo", "R_old from the simulator vs the fitted click model"),
    ("page_grpo", "page_grpo_with_features_only", "a click model that sees each item vs features"),
    ("page_grpo", "page_grpo_with_pessimistic", "no pessimism vs one posterior sd below"),
)
CHAIN_INPUTS = (
    "query_logs_train",
    "query_logs_heldout",
    "catalogue_items",
    "item_experience_scores",
)


def unit_values(per_session: pd.DataFrame) -> pd.DataFrame:
    """One row per ranker of one unit's A/B (``ab_session_metrics``): ``ctr_change`` and
    ``long_view_change`` (ratio of means vs the logged order - 1; the expected exposure is
    the same for every ranker, so clicks and CTR give the same ratio) and ``true_ndcg_diff``."""
    means = per_session.groupby("ranker")[[CLICKS, LONG_VIEWS, NDCG]].mean()
    base = means.loc[LOGGED]
    return (
        pd.DataFrame(
            {
                "ctr_change": means[CLICKS] / base[CLICKS] - 1.0,
                "long_view_change": means[LONG_VIEWS] / base[LONG_VIEWS] - 1.0,
                "true_ndcg_diff": means[NDCG] - base[NDCG],
            }
        )
        .rename_axis("ranker")
        .reset_index()
    )


def summarise_units(units: pd.DataFrame) -> pd.DataFrame:
    """The over-seeds table of ``units`` (columns ``expmodel_seed``, ``grpo_seed``, ``ranker``
    and ``METRICS``): one row per ranker, then one per contrast of ``CONTRASTS`` whose rankers
    are there; per metric the mean over units, ``_low`` / ``_high`` (95 % t interval over
    units), ``_mde`` and the readable ``_text``; ``units`` counts them."""
    rows = []
    pretrained = units["ranker"].isin(list(PRETRAINED))
    # A pretrained ranker is one model per ExpModel seed, repeated on every GRPO seed's rows.
    units = pd.concat(
        [units[~pretrained], units[pretrained].drop_duplicates(["expmodel_seed", "ranker"])]
    )
    for ranker, part in units[units["ranker"] != LOGGED].groupby("ranker", sort=False):
        rows.append({"row": ranker, "kind": "ranker", **_intervals(part[list(METRICS)])})
    keys = ["expmodel_seed", "grpo_seed"]
    for a, b, what in CONTRASTS:
        if not {a, b} <= set(units["ranker"]):
            continue
        on = ["expmodel_seed"] if a in PRETRAINED else keys
        left = units[units["ranker"] == a].set_index(on)[list(METRICS)]
        right = units[units["ranker"] == b].set_index(on)[list(METRICS)]
        paired = left.join(right, lsuffix="_a", rsuffix="_b", how="inner")
        differences = pd.DataFrame({m: paired[f"{m}_a"] - paired[f"{m}_b"] for m in METRICS})
        rows.append(
            {"row": f"{a} - {b}", "kind": "contrast", "what": what, **_intervals(differences)}
        )
    return pd.DataFrame(rows)


def summarise_sessions(per_session: pd.DataFrame) -> pd.DataFrame:
    """The table of ``summarise_units`` for one unit, its intervals paired over the held-out
    sessions (one seed: they cover the evaluation's sampling of sessions, not the training
    run's; ``creditflow.chain.ab_test.controls``, as the chain's ``reranker_ab`` contrast rows):
    each ranker against the logged order, then the contrasts."""
    rows = []
    for ranker in per_session["ranker"].drop_duplicates():
        if ranker != LOGGED:
            values = session_differences(per_session, ranker, LOGGED, k=K)
            rows.append({"row": ranker, "kind": "ranker", **_intervals(values)})
    contrasts = contrast_rows(per_session, CONTRASTS, k=K)
    contrasts = contrasts.rename(columns={"contrast": "row", "sessions": "units"})
    table = pd.concat([pd.DataFrame(rows), contrasts.assign(kind="contrast")], ignore_index=True)
    return table.assign(basis="sessions (1 seed)")


def _intervals(values: pd.DataFrame) -> dict[str, Any]:
    return {"units": len(values), **interval_columns(values)}


def load_chain(project: Path) -> dict[str, Any]:
    """The chain's ``CHAIN_INPUTS`` (newest versions) of the project in ``project``."""
    bootstrap_project(project)
    with KedroSession.create(project_path=project) as session:
        catalog = session.load_context().catalog
        return {name: catalog.load(name) for name in CHAIN_INPUTS}


def run_unit(  # noqa: PLR0913 - the chain's data, its parameters, the seeds and the cache
    chain: Mapping[str, Any],
    params: Mapping[str, Any],
    expmodel_seed: int,
    grpo_seed: int,
    pretrained: dict[tuple[int, str], Any],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One unit: every ranker's A/B values (``unit_values``) on the held-out sessions."""
    train, heldout = chain["query_logs_train"], chain["query_logs_heldout"]
    items = chain["catalogue_items"]
    scores = {
        "real": chain["item_experience_scores"],
        "shuffled": shuffled_scores(chain["item_experience_scores"], seed=1000 + expmodel_seed),
    }
    pretrain_params, grpo_defaults = params["reranker_pretrain"], params["reranker_grpo"]
    # One y_aug reranker per ExpModel seed and scores, reused across GRPO seeds.
    for kind, kind_scores in scores.items():
        if (expmodel_seed, kind) not in pretrained:
            targets = build_augmented_targets(train, kind_scores)
            model, _ = pretrain_reranker(
                targets, train, items, kind_scores, None, pretrain_params, "yaug"
            )
            pretrained[expmodel_seed, kind] = model
    models = {name: pretrained[expmodel_seed, kind] for name, kind in PRETRAINED.items()}
    runs = {
        name: (kind, {**grpo_defaults, "reward": {**grpo_defaults["reward"], **reward}})
        for name, (kind, reward) in VARIANTS.items()
    } | {
        f"{VARIANT}{name}": ("real", variant_params(grpo_defaults, variant))
        for name, variant in grpo_defaults.get("r_old_variants", {}).items()
    }
    click_models = {}
    for name, (kind, run_params) in runs.items():
        grpo = {**run_params, "grpo": {**run_params["grpo"], "seed": grpo_seed}}
        key = repr(sorted(grpo["click_model"].items()))
        if key not in click_models:  # each click-model setting fitted once per unit
            click_models[key] = click_model_table(fit_click_model(train, items, grpo))
        t0 = time.perf_counter()
        models[name], _, _ = train_reranker_page_grpo(
            pretrained[expmodel_seed, kind],
            train,
            items,
            scores[kind],
            click_models[key],
            None,
            grpo,
            pretrain_params,
            params["annotation"],
        )
        logging.getLogger(__name__).warning(
            "expmodel seed %d, grpo seed %d: %s in %.0f s",
            expmodel_seed,
            grpo_seed,
            name,
            time.perf_counter() - t0,
        )
    users = simulated_users(
        heldout, items, ClickModel.from_params(params["annotation"]["click_model"])
    )
    frames = []
    for kind, kind_scores in scores.items():
        mine = {n: m for n, m in models.items() if _kind(n) == kind}
        pages = serve_pages(
            heldout, items, kind_scores, mine, dict.fromkeys(mine, "yaug"), pretrain_params
        )
        frames.append(ab_session_metrics(pages, heldout, users, k=K))
    per_session = pd.concat(frames).drop_duplicates(["ranker", "session_id"])
    per_session = per_session.assign(expmodel_seed=expmodel_seed, grpo_seed=grpo_seed)
    return unit_values(per_session).assign(expmodel_seed=expmodel_seed, grpo_seed=grpo_seed), (
        per_session
    )


def _kind(name: str) -> str:
    if name in PRETRAINED:
        return PRETRAINED[name]
    return "real" if name.startswith(VARIANT) else VARIANTS[name][0]


def markdown(table: pd.DataFrame) -> str:
    """The summary as a markdown table (the ``_text`` columns)."""
    lines = [
        "| row | units | CTR change vs logged | long-view change | true nDCG@10 diff |",
        "| --- | --- | --- | --- | --- |",
    ]
    for _, row in table.iterrows():
        cells = [str(row[f"{m}_text"]) for m in METRICS]
        lines.append(f"| {row['row']} | {row['units']} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def parse_runs(items: Sequence[str]) -> dict[int, Path]:
    """``SEED=PATH`` pairs.

    >>> parse_runs(["0=.", "1=/tmp/e1"])
    {0: PosixPath('.'), 1: PosixPath('/tmp/e1')}
    """
    out = {}
    for item in items:
        seed, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--expmodel-run {item!r} is not SEED=PATH")
        out[int(seed)] = Path(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--expmodel-run", action="append", default=[], help="SEED=PATH")
    parser.add_argument(
        "--merge", type=Path, nargs="*", default=[], help="units CSVs of other runs to pool in"
    )
    parser.add_argument("--grpo-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, required=True, help="path stem of the tables")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    bootstrap_project(ROOT)
    with KedroSession.create(project_path=ROOT) as session:
        params = session.load_context().params
    units_path = Path(f"{args.out}_units.csv")
    done = pd.read_csv(units_path) if units_path.exists() else pd.DataFrame()
    others = [pd.read_csv(path) for path in args.merge]
    for expmodel_seed, project in parse_runs(args.expmodel_run).items():
        chain, pretrained = load_chain(project.resolve()), {}
        for grpo_seed in args.grpo_seeds:
            if (
                len(done)
                and (
                    (done["expmodel_seed"] == expmodel_seed) & (done["grpo_seed"] == grpo_seed)
                ).any()
            ):
                continue
            unit, per_session = run_unit(chain, params, expmodel_seed, grpo_seed, pretrained)
            done = pd.concat([done, unit], ignore_index=True)
            units_path.parent.mkdir(parents=True, exist_ok=True)
            done.to_csv(units_path, index=False)  # after every unit: a cut run keeps its units
            sessions_path = Path(f"{args.out}_sessions_e{expmodel_seed}_g{grpo_seed}.csv")
            per_session.to_csv(sessions_path, index=False)
            session_table = summarise_sessions(per_session)
            session_table.to_csv(f"{args.out}_sessions_e{expmodel_seed}_g{grpo_seed}_table.csv")
            Path(f"{args.out}_sessions_e{expmodel_seed}_g{grpo_seed}.md").write_text(
                markdown(session_table)
            )
    table = summarise_units(pd.concat([done, *others], ignore_index=True))
    table.to_csv(f"{args.out}.csv", index=False)
    Path(f"{args.out}.md").write_text(markdown(table))
    sys.stdout.write(markdown(table))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
