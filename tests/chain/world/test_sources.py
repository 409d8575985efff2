"""A catalogue and impression logs of your own as the experience chain's tables: the
conversion, errors that name the dataset, row and column, the optional
true_quality, and the example of docs/howto/own_data.md run through the chain's first nodes in a
Kedro session."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kedro.framework.session import KedroSession
from PIL import Image

from creditflow.chain.reranker.training import evaluate_rankings
from creditflow.chain.world.catalogue import SESSION_COLUMNS, ClickModel, candidate_response
from creditflow.chain.world.sources import ranking_items, ranking_sessions
from creditflow.errors import TaskSourceError
from creditflow.pipelines.chain_parameters import RankingSource
from creditflow.pipelines.reranker_eval import nodes as eval_nodes
from tests.kedro_project import NodeCounter, copy_project

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

# The example of docs/howto/own_data.md, as it writes it.
CATALOGUE_CSV = """\
item_id,image_path,title,category,popularity
v1,data/01_raw/covers/v1.png,Sourdough starter in five days,cooking,1200
v2,data/01_raw/covers/v2.png,WOW!!! you won't believe this pasta,cooking,5400
v3,data/01_raw/covers/v3.png,Ramen broth from scratch,cooking,300
v4,data/01_raw/covers/v4.png,Island hopping on a budget,travel,800
v5,data/01_raw/covers/v5.png,this beach thing,travel,6100
v6,data/01_raw/covers/v6.png,Backpacking the mountains: a guide,travel,
"""
IMPRESSIONS_CSV = """\
session_id,query,position,item_id,clicked,long_viewed
s1,pasta recipe,0,v2,1,0
s1,pasta recipe,1,v1,1,1
s1,pasta recipe,2,v3,0,0
s2,pasta recipe,0,v2,0,0
s2,pasta recipe,1,v3,1,1
s2,pasta recipe,2,v1,0,0
s3,beach itinerary,0,v5,1,0
s3,beach itinerary,1,v4,0,0
s3,beach itinerary,2,v6,0,0
s4,ramen,0,v3,1,1
s4,ramen,1,v1,0,0
s4,ramen,2,v2,0,0
"""
CATALOG_ENTRIES = """\
my_catalogue:
  type: pandas.CSVDataset
  filepath: data/01_raw/my_catalogue.csv
  load_args: {dtype: str, keep_default_na: false}
  metadata: {task_schema: ranking_items}

my_impressions:
  type: pandas.CSVDataset
  filepath: data/01_raw/my_impressions.csv
  load_args: {dtype: str, keep_default_na: false}
  metadata: {task_schema: ranking_impressions}
"""
SOURCES = {"items": "my_catalogue", "impressions": "my_impressions"}


def _covers(root: Path) -> None:
    (root / "data/01_raw/covers").mkdir(parents=True, exist_ok=True)
    for i in range(1, 7):
        colour = (40 * i, 200 - 20 * i, 90)
        Image.new("RGB", (48, 36), colour).save(root / f"data/01_raw/covers/v{i}.png")


@pytest.fixture
def files(tmp_path, monkeypatch) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two files of docs/howto/own_data.md, loaded as its catalog entries load them (every cell as text),
    with the covers under the working directory."""
    monkeypatch.chdir(tmp_path)
    _covers(tmp_path)
    read = {"dtype": str, "keep_default_na": False}
    return (
        pd.read_csv(io.StringIO(CATALOGUE_CSV), **read),
        pd.read_csv(io.StringIO(IMPRESSIONS_CSV), **read),
    )


def test_catalogue_becomes_the_chains_item_table(files):
    items = ranking_items(files[0], "my_catalogue")
    assert items.columns.tolist() == [
        "item_id",
        "category",
        "title",
        "image_png",
        "popularity",
        "source_item_id",
        "metadata",
    ]
    assert items["item_id"].tolist() == list(range(6))
    assert items["source_item_id"].tolist() == [f"v{i}" for i in range(1, 7)]
    assert items["popularity"].tolist() == [1200.0, 5400.0, 300.0, 800.0, 6100.0, 1.0]
    with Image.open(io.BytesIO(items["image_png"][0])) as cover:
        assert (cover.format, cover.mode, cover.size) == ("PNG", "RGB", (48, 36))
    assert "true_quality" not in items.columns  # none given: nothing invented


def test_impressions_become_sessions_with_labels_bands_and_a_cut(files):
    items = ranking_items(files[0], "my_catalogue")
    sessions = ranking_sessions(files[1], items, "my_impressions", list_length=3)
    expected = [c for c in SESSION_COLUMNS if c not in ("relevance", "true_quality")]
    assert sessions.columns.tolist() == [*expected, "source_session_id"]
    first = sessions.iloc[0]
    assert first["candidates"] == [1, 0, 2]  # v2, v1, v3 in position order
    assert first["logged_order"] == [0, 1, 2]
    assert first["labels"] == ["C", "C", "E"] and first["long_views"] == [0, 1, 0]
    # pasta recipe: 2 sessions, the head; the two one-session queries in order of appearance.
    assert sessions["query_id"].tolist() == [0, 0, 1, 2]
    assert sessions["query_frequency_band"].tolist() == ["head", "head", "torso", "tail"]
    # list_length 2: every session cut to its first two positions; 4 drops all.
    assert ranking_sessions(files[1], items, "x", list_length=2)["candidates"][0] == [1, 0]
    with pytest.raises(TaskSourceError, match="no session shows list_length = 4"):
        ranking_sessions(files[1], items, "my_impressions", list_length=4)


def test_a_known_quality_reaches_the_simulated_users(files):
    catalogue = files[0].assign(true_quality=[0.9, 0.2, 0.7, 0.6, 0.1, 0.8])
    items = ranking_items(catalogue, "my_catalogue")
    assert items["true_clickbait"].tolist() == [0.0] * 6  # not given: the users ignore it
    impressions = files[1].assign(relevance=["1", "0.5", "", "1", "1", "1"] * 2)
    sessions = ranking_sessions(impressions, items, "my_impressions", list_length=3)
    assert sessions.columns.tolist() == [*SESSION_COLUMNS, "source_session_id"]
    np.testing.assert_allclose(sessions["relevance"][0], [1.0, 0.5, 1.0])
    np.testing.assert_allclose(sessions["true_quality"][0], [0.2, 0.45, 0.7])  # r * quality
    click, long_view = candidate_response(sessions, items, ClickModel())
    assert click.shape == long_view.shape == (4, 3)


@pytest.mark.parametrize(
    ("table", "change", "message"),
    [
        (
            0,
            lambda f: f.drop(columns="category"),
            "task source `t`: missing column(s) ['category']",
        ),
        (
            0,
            lambda f: f.assign(item_id=["v1", "v2", "v3", "v4", "v5", "v1"]),
            "task source `t`, row 5, column `item_id`: 'v1' repeats (first on row 0)",
        ),
        (
            0,
            lambda f: f.assign(image_path=[*f["image_path"][:3], "nope.png", *f["image_path"][4:]]),
            "task source `t`, row 3, column `image_path`: no image file at nope.png",
        ),
        (
            0,
            lambda f: f.assign(popularity=["1", "2", "0", "4", "5", "6"]),
            "task source `t`, row 2, column `popularity`: 0.0 is outside (0.0, inf)",
        ),
        (
            0,
            lambda f: f.assign(true_quality=["0.5", "", "1", "1", "1", "1"]),
            "task source `t`, row 1, column `true_quality`: missing value",
        ),
        (
            1,
            lambda f: f.assign(item_id=[*f["item_id"][:4], "v9", *f["item_id"][5:]]),
            "task source `t`, row 4, column `item_id`: item 'v9' is not in the catalogue",
        ),
        (
            1,
            lambda f: f.assign(clicked=["1", "1", "0", "yes", *f["clicked"][4:]]),
            "task source `t`, row 3, column `clicked`: 'yes' is not 0 or 1",
        ),
        (
            1,
            lambda f: f.assign(long_viewed=["0", "1", "1", *f["long_viewed"][3:]]),
            "task source `t`, row 2, column `long_viewed`: a long view without a click",
        ),
        (
            1,
            lambda f: f.assign(position=["0", "1", "1", *f["position"][3:]]),
            "task source `t`, row 2, column `position`: session 's1' has this position on row 1",
        ),
        (
            1,
            lambda f: f.assign(query=["pasta recipe", "pasta", *f["query"][2:]]),
            "task source `t`, row 1, column `query`: session 's1' has the query 'pasta recipe'",
        ),
        (
            1,
            lambda f: f.assign(exposed=["0", *["1"] * 11]),
            "task source `t`, row 0, column `clicked`: a click on an unexposed candidate",
        ),
        (
            1,
            lambda f: f.assign(
                exposed=["0"] * len(f), clicked=["0"] * len(f), long_viewed=["0"] * len(f)
            ),
            "task source `t`, column `exposed`: no impression of the kept sessions is exposed",
        ),
    ],
)
def test_errors_name_the_dataset_row_and_column(files, table, change, message):
    catalogue, impressions = files
    with pytest.raises(TaskSourceError) as error:
        if table == 0:
            ranking_items(change(catalogue), "t")
        else:
            ranking_sessions(change(impressions), ranking_items(catalogue, "c"), "t", 3)
    assert str(error.value).startswith(message), str(error.value)


def test_without_true_quality_the_truth_columns_are_left_out(files, caplog):
    items = ranking_items(files[0], "my_catalogue")
    sessions = ranking_sessions(files[1], items, "my_impressions", list_length=3)
    rankings = torch_rankings(sessions)
    assert evaluate_rankings(rankings, sessions, None, k=2)["true_ndcg"].isna().all()
    with caplog.at_level(logging.INFO, logger="creditflow"):
        assert eval_nodes.simulate_reranker_ab(None, sessions, items, {}, {}).empty
    table, _ = eval_nodes.summarise_reranker_ab(pd.DataFrame(), {}, {})
    sweep, _ = eval_nodes.sweep_click_quality_weight(None, sessions, items, {}, {})
    assert table["note"].tolist() == sweep["note"].tolist() == [eval_nodes.NO_TRUTH]
    assert "simulated A/B is left out" in caplog.text


def torch_rankings(sessions: pd.DataFrame):
    import torch  # noqa: PLC0415 - only this helper needs it

    return torch.tensor([list(order) for order in sessions["logged_order"]])


def test_sources_are_both_synthetic_or_both_datasets():
    with pytest.raises(ValueError, match="set both to synthetic or both to catalog datasets"):
        RankingSource.model_validate({"items": "my_catalogue", "impressions": "synthetic"})
    RankingSource.model_validate(SOURCES)


# --- the README's example in a Kedro session ------------------------------------------------


@pytest.mark.slow
def test_the_readme_example_runs_the_chains_first_nodes(project_root, tmp_path, monkeypatch):
    """``kedro run --params "annotation.source.items=my_catalogue,..."`` over docs/howto/own_data.md's
    files: the catalogue and logs are checked and converted, split, annotated (heuristic) and
    turned into click-first pre-training targets, all saved as the chain's versioned tables."""
    project = copy_project(project_root, tmp_path, monkeypatch)
    (project / "conf/local/catalog.yml").write_text(CATALOG_ENTRIES, encoding="utf-8")
    _covers(project)
    (project / "data/01_raw/my_catalogue.csv").write_text(CATALOGUE_CSV, encoding="utf-8")
    (project / "data/01_raw/my_impressions.csv").write_text(IMPRESSIONS_CSV, encoding="utf-8")
    params = {
        "annotation": {"source": SOURCES, "query_logs": {"list_length": 3}},
        "tracking": {"enabled": False},
    }
    counter = NodeCounter()
    nodes = ["generate_items", "generate_query_logs", "annotate_items", "build_click_first_targets"]
    with KedroSession.create(project_path=project, runtime_params=params) as session:
        session._hook_manager.register(counter)
        session.run(node_names=nodes)
        run_id = session.session_id
    assert sorted(counter.started) == sorted(nodes)

    def saved(folder: str, name: str) -> pd.DataFrame:
        return pd.read_parquet(project / f"data/{folder}/{name}.parquet/{run_id}/{name}.parquet")

    items = saved("03_primary", "catalogue_items")
    train, heldout = (
        saved("03_primary", "query_logs_train"),
        saved("03_primary", "query_logs_heldout"),
    )
    annotations = saved("04_feature", "item_annotations")
    targets = saved("05_model_input", "reranker_targets_click")
    assert items["source_item_id"].tolist() == [f"v{i}" for i in range(1, 7)]
    assert (len(train), len(heldout)) == (3, 1)  # round(0.25 * 4) held out
    assert sorted([*train["source_session_id"], *heldout["source_session_id"]]) == [
        "s1",
        "s2",
        "s3",
        "s4",
    ]
    assert (annotations["status"] == "ok").all() and len(annotations) == 6
    assert len(targets) == 3


@pytest.mark.slow
def test_an_unknown_source_fails_before_the_first_node(project_root, tmp_path, monkeypatch):
    project = copy_project(project_root, tmp_path, monkeypatch)
    (project / "conf/local/catalog.yml").write_text(CATALOG_ENTRIES, encoding="utf-8")
    params = {
        "annotation": {"source": {"items": "my_catalog", "impressions": "my_impressions"}},
        "tracking": {"enabled": False},
    }
    counter = NodeCounter()
    with KedroSession.create(project_path=project, runtime_params=params) as session:
        session._hook_manager.register(counter)
        with pytest.raises(
            Exception, match="annotation.source.items: no catalog dataset `my_catalog`"
        ):
            session.run(pipeline_names=["annotation"])
    assert counter.started == []


@pytest.mark.slow
def test_the_whole_chain_runs_on_files_without_true_quality(tmp_path, monkeypatch):
    """The synthetic world exported as a user would have it (covers as files, ids as text, one
    row per impression, no hidden truth), read back through annotation.source: every node of
    the default run completes; what needs the truth is NaN or a note."""
    from kedro.io import MemoryDataset  # noqa: PLC0415
    from kedro.runner import SequentialRunner  # noqa: PLC0415

    from creditflow.chain.world.catalogue import generate_catalogue, generate_sessions  # noqa: PLC0415
    from tests.pipelines._experience_chain import (  # noqa: PLC0415
        chain_pipeline,
        file_catalog,
        smallest_params,
    )
    from tests.pipelines._params import deep_update  # noqa: PLC0415

    monkeypatch.chdir(tmp_path)
    world = generate_catalogue(40, seed=0, image_size=32)
    logs = generate_sessions(world, n_queries=6, n_sessions=80, list_length=6, seed=0)
    (tmp_path / "covers").mkdir()
    catalogue = []
    for item in world.itertuples():
        (tmp_path / f"covers/{item.item_id}.png").write_bytes(item.image_png)
        catalogue.append(
            {
                "item_id": f"item-{item.item_id}",
                "image_path": f"covers/{item.item_id}.png",
                "title": item.title,
                "category": item.category,
                "popularity": item.popularity,
            }
        )
    impressions = [
        {
            "session_id": f"s{session.session_id}",
            "query": session.query_text,
            "position": position,
            "item_id": f"item-{session.candidates[candidate]}",
            "clicked": session.clicks[candidate],
            "long_viewed": session.long_views[candidate],
            "exposed": int(session.labels[candidate] != "U"),
        }
        for session in logs.itertuples()
        for position, candidate in enumerate(session.logged_order)
    ]
    params = deep_update(
        {name: values for name, values in smallest_params().items() if name != "movielens_eval"},
        {
            "annotation": {"source": SOURCES},
            "expmodel_pft": {"pairs": {"bands": ["head", "torso", "tail"]}},
            "reranker_grpo": {"reward": {"r_old": "logged_clicks"}},
        },
    )
    catalog = file_catalog(tmp_path / "out", params)
    catalog["annotation_source_items"] = MemoryDataset(pd.DataFrame(catalogue))
    catalog["annotation_source_impressions"] = MemoryDataset(pd.DataFrame(impressions))
    SequentialRunner().run(chain_pipeline(), catalog)

    evaluation = catalog.load("reranker_evaluation")
    assert evaluation["true_ndcg"].isna().all() and evaluation["click_ndcg"].notna().all()
    assert catalog.load("reranker_ab")["note"].tolist() == [eval_nodes.NO_TRUTH]
    assert catalog.load("reranker_ab_sweep")["note"].tolist() == [eval_nodes.NO_TRUTH]
    experience = catalog.load("expmodel_evaluation")
    assert experience.filter(like="kendall_tau").isna().all(axis=None)
    # Query mode (the default) scores the items the logs show, per (query, item); with no
    # hidden quality the query row has no (query, item) truth to hold them to.
    scored = catalog.load("item_experience_scores")["item_id"].nunique()
    assert experience["target"].tolist()[0] == "quality"
    assert experience["target"].tolist()[-1] == "query_quality"
    assert (experience["items"].iloc[:-1] == scored).all() and experience["items"].iloc[-1] == 0
