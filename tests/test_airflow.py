"""``kedro airflow create`` (kedro-airflow) turns the registered ``tapo`` pipeline into a DAG file.

Airflow itself is not installed: the generated file is read as text (and parsed as Python),
and its tasks and edges are checked against the pipeline that ``kedro run --pipelines tapo``
runs, ingestion node included.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kedro_airflow", reason="kedro-airflow is not installed (docs/scale_out.md)")

from kedro.framework.project import pipelines  # noqa: E402
from kedro.framework.startup import bootstrap_project  # noqa: E402
from slugify import slugify  # noqa: E402 - kedro-airflow's dependency, the one it names tasks with

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

TIMEOUT_S = 300
TASK = re.compile(
    r'@task\(task_id="([^"]+)"\)\n\s+def \w+\(\):\n\s+_run_kedro_node\(node_names=\[([^\]]*)\]\)'
)
EDGE = re.compile(r'tasks\["([^"]+)"\] >> tasks\["([^"]+)"\]')


@pytest.fixture(scope="module")
def tapo_dag(project_root: Path, tmp_path_factory) -> str:
    target = tmp_path_factory.mktemp("airflow_dags")
    # The kedro console script of this interpreter's environment.
    kedro = Path(sys.executable).with_name("kedro")
    completed = subprocess.run(
        [str(kedro), "airflow", "create", "--pipelines", "tapo", "--target-dir", str(target)],
        cwd=project_root,
        env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    # One file per pipeline: <package>_<pipeline>_dag.py (the env is the default, local).
    assert [p.name for p in target.iterdir()] == ["creditflow_tapo_dag.py"]
    return (target / "creditflow_tapo_dag.py").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def tapo_pipeline(project_root: Path):
    bootstrap_project(project_root)
    return pipelines["tapo"]


@pytest.mark.slow
def test_the_dag_has_one_task_per_node_of_the_tapo_pipeline(tapo_dag, tapo_pipeline):
    ast.parse(tapo_dag)  # valid Python, although airflow is not here to import it
    assert 'pipeline_name = "tapo"' in tapo_dag and 'env = "local"' in tapo_dag
    tasks = {task_id: nodes for task_id, nodes in TASK.findall(tapo_dag)}
    expected = {slugify(node.name): f'"{node.name}"' for node in tapo_pipeline.nodes}
    assert tasks == expected
    # Naming: node names slugified, one Kedro node per task.
    for node in ("tapo.train_tapo_policy", "evaluate_tapo_policy_sft", "build_tapo_tasks"):
        assert tasks[slugify(node)] == f'"{node}"'
    assert "tapo-train-tapo-policy" in tasks


@pytest.mark.slow
def test_the_dag_edges_are_the_pipeline_dependencies(tapo_dag, tapo_pipeline):
    edges = set(EDGE.findall(tapo_dag))
    expected = {
        (slugify(parent.name), slugify(child.name))
        for child, parents in tapo_pipeline.node_dependencies.items()
        for parent in parents
    }
    assert edges == expected
    assert ("warm-start-tapo-policy", "tapo-train-tapo-policy") in edges
    # tapo reads the ingested MGSM table; the ingest node is data_ingest's, not a task here.
    assert not any("ingest" in parent or "ingest" in child for parent, child in edges)
