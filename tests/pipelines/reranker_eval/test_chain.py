"""The whole experience-model chain (the default `kedro run`) at the smallest sizes, on the
project's catalog entries written to a temporary folder."""

import pytest

from creditflow.chain.ab_test.controls import CONTROLLED, variant_contrasts, variant_ranker
from creditflow.chain.reranker.data import LOGGED, RERANKER_INPUTS
from creditflow.pipeline_registry import DEFAULT_PIPELINES
from creditflow.pipelines.reranker_eval.nodes import SAMPLED_PAGES
from tests.pipelines._experience_chain import (
    CHAIN,
    chain_catalog,
    chain_pipeline,
    smallest_params,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


def test_default_pipelines_are_the_experience_chain():
    assert tuple(DEFAULT_PIPELINES) == CHAIN


def test_chain_writes_every_artefact_through_the_catalog():
    catalog = chain_catalog()
    pipeline = chain_pipeline()
    # Nothing the chain makes stays in memory: each output is a catalog dataset on disk.
    for name in sorted(pipeline.all_outputs()):
        assert type(catalog.get(name)).__name__ != "MemoryDataset", name
        assert catalog.exists(name), name
    # The training pipelines' checkpoint stores are directories the chain reads as inputs.
    checkpoints = {
        f"{n}_checkpoints"
        for n in ("expmodel_sft", "expmodel_pft", "reranker_pretrain", "reranker_grpo")
    }
    # ... the Kedro credentials (hooks.credentials.CredentialsHook), which the annotator reads, and the
    # catalogue's and logs' sources (hooks.task_source.TaskSourceHook; nothing for `synthetic`).
    sources = {"annotation_source_items", "annotation_source_impressions"}
    assert (
        pipeline.inputs()
        == {f"params:{n}" for n in CHAIN if n != "augmented_targets"}
        | checkpoints
        | {"credentials"}
        | sources
    )
    table = catalog.load("reranker_evaluation")  # read back from CSV
    variants = list(smallest_params()["reranker_grpo"]["r_old_variants"])
    rankers = {LOGGED, *RERANKER_INPUTS, *CONTROLLED, *SAMPLED_PAGES}
    rankers |= {variant_ranker(name) for name in variants}
    assert set(table["ranker"]) == rankers
    assert "all" in set(table["band"])
    ab = catalog.load("reranker_ab")
    assert set(ab.loc[ab["kind"] == "ranker", "ranker"]) == rankers | {
        "oracle_clicks",
        "oracle_quality",
    }
    contrasts = ab.loc[ab["kind"] == "contrast", "ranker"].tolist()
    assert contrasts == [f"{a} - {b}" for a, b, _ in variant_contrasts(variants)]
    assert {"ctr", "ctr_se", "ctr_change_vs_logged", "ctr_change_vs_logged_se"} <= set(ab.columns)
