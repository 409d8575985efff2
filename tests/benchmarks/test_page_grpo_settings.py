"""benchmarks/page_grpo_settings.py chooses page-GRPO settings on the validation side of the
training logs: it pre-trains and trains on one part of query_logs_train, scores on the other,
and never loads the held-out A/B sessions."""

import doctest
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
from kedro.io import AbstractDataset, DataCatalog, DatasetError, MemoryDataset

from creditflow.chain.clicks.logged import validation_split
from creditflow.chain.reranker.data import split_sessions
from creditflow.chain.world.catalogue import generate_catalogue, generate_sessions
from tests.pipelines._experience_chain import smallest_params

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "page_grpo_settings.py"
spec = importlib.util.spec_from_file_location("bench_page_grpo_settings", SCRIPT)
page_grpo_settings = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = page_grpo_settings
spec.loader.exec_module(page_grpo_settings)


class Untouchable(AbstractDataset):
    """The held-out A/B sessions: loading them fails the test."""

    def _load(self):
        raise AssertionError("the tuning loaded the held-out A/B sessions")

    def _save(self, data) -> None:
        raise AssertionError("the tuning wrote the held-out A/B sessions")

    def _describe(self) -> dict:
        return {}


def test_doctests():
    assert doctest.testmod(page_grpo_settings).failed == 0


def test_tuning_reads_no_heldout_session(monkeypatch):
    params = smallest_params()
    catalogue = generate_catalogue(40, seed=0, image_size=32)
    sessions = generate_sessions(catalogue, n_queries=6, n_sessions=80, list_length=6, seed=0)
    train, heldout = split_sessions(sessions, 0.25, seed=0)
    scores = pd.DataFrame({"item_id": catalogue["item_id"], "s_exp": catalogue.index / 40.0})
    catalog = DataCatalog(
        {
            "query_logs_train": MemoryDataset(train),
            "query_logs_heldout": Untouchable(),
            "catalogue_items": MemoryDataset(catalogue),
            "item_experience_scores": MemoryDataset(scores),
        }
    )
    pretrained_on = []
    real_pretrain = page_grpo_settings.pretrain_reranker

    def recording_pretrain(targets, sessions, *args):
        pretrained_on.append((set(targets["session_id"]), set(sessions["session_id"])))
        return real_pretrain(targets, sessions, *args)

    monkeypatch.setattr(page_grpo_settings, "pretrain_reranker", recording_pretrain)
    inputs = page_grpo_settings.load_tuning_inputs(catalog.load)
    table = page_grpo_settings.tune(inputs, params, ["grpo.steps=1"], samples=1)
    fit_part, validation = validation_split(train, params["reranker_grpo"]["validation"])
    # The start reranker is pre-trained once, on the fit part's targets and sessions only.
    assert pretrained_on == [(set(fit_part["session_id"]),) * 2]
    assert set(fit_part["session_id"]).isdisjoint(validation["session_id"])
    # Scored on the validation part of the training logs, every one of its sessions.
    assert set(validation["session_id"]) <= set(train["session_id"])
    assert set(validation["session_id"]).isdisjoint(heldout["session_id"])
    assert (table.loc[table["band"] == "all", "sessions"] == len(validation)).all()
    assert set(table["ranker"]) == {"greedy", "sampled"}
    with pytest.raises(DatasetError) as refused:  # the guard itself works
        catalog.load("query_logs_heldout")
    assert "held-out" in str(refused.value.__cause__)
