"""The layout the style guide asks for, checked on the source: the layer order of creditflow's
packages and its import rules (function-level imports included), no import circle, thin Kedro
nodes, ``.backward()`` only in the two trainers, and a description on every config field."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

import creditflow.config
import creditflow.training.strategies  # noqa: F401  (registers every shipped strategy's options)
from creditflow.config.schema import Block

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "creditflow"
MAX_NODE_BODY_LINES = 20
MAX_MODULE_LINES = 750
# The GRPO update and the one supervised trainer; every other loop goes through them.
BACKWARD_HOMES = {"training/grpo.py", "training/supervised.py"}

# The layers, bottom first: a top-level package (or module) of creditflow may import the
# packages of the layers *below* its own, never those above. Within a layer, a package imports
# only itself, except for the pairs in PEER_IMPORTS.
LAYERS: list[tuple[str, set[str]]] = [
    # the version; the project's exceptions; files written whole or not at all
    ("errors", {"__init__", "errors", "io_atomic"}),
    ("config", {"config"}),  # parameter checks: standard library and pydantic only
    (
        "primitives",  # pure functions, models, task worlds, loaders, tracking, reports
        {
            "algorithms",
            "rewards",
            "models",
            "tasks",
            "ingest",
            "tracking",
            "redaction",
            "integrity",
            "reporting",
        },
    ),
    ("rollout", {"rollout"}),  # the engine's sampling side
    ("engine", {"training"}),  # GRPO, supervised training, strategies, checkpoints
    # the experience chain (creditflow.chain), on the engine; the catalog's artifact datasets
    ("chain", {"chain", "datasets"}),
    # the Python entry points outside Kedro, over the engine; the contract checks of strategies
    # and rewards for tests
    ("api", {"api", "testing"}),
    ("kedro", {"pipelines", "pipeline_registry", "__main__"}),
    ("hooks", {"hooks"}),
    ("settings", {"settings"}),
]
PEER_IMPORTS = {
    # a task source's rows are checked against the task world's columns, and its gold
    # answers as the reasoning reward reads them
    "ingest": {"tasks", "rewards"},
}
# The chain's sub-packages, bottom first, held the same way: one imports those of the ranks below
# its own and its peers in the same rank. The ExpModel learns the annotations (never the
# reverse); the page reward reads the click model fitted to the logs, and that fit reads the
# reranker's session features, so ``reranker`` and ``clicks`` share a rank (the module-level
# circle check still holds between them).
CHAIN_LAYERS: list[set[str]] = [
    {"__init__", "config"},
    {"world"},
    {"annotation"},
    {"expmodel"},
    {"reranker", "clicks"},
    {"ab_test"},
]
# The chain has one home, creditflow.chain: no module of these names (a chain module's name in
# the engine's packages) may exist beside it.
CHAIN_MODULES_ELSEWHERE = {
    "creditflow.annotation",
    "creditflow.experience",
    "creditflow.algorithms.click_model",
    "creditflow.algorithms.feedback",
    "creditflow.algorithms.ranking",
    "creditflow.config.reranking",
    "creditflow.ingest.ranking_sources",
    "creditflow.models.reranker",
    "creditflow.models.scorer",
    "creditflow.tasks.movielens",
    "creditflow.tasks.reranking",
}
# The chain's modules that the parameter check reads before torch loads; like config/, they
# import only the standard library, pydantic and the bottom layers.
CHAIN_BOTTOM = {"creditflow.chain", "creditflow.chain.config"}
# Function-level imports of creditflow modules hide arrows from a reader; the only ones allowed
# are these, each with its reason. (Third-party imports inside functions need a comment saying
# why: optional extras such as vllm or peft, or heavy modules only some calls need.)
DEFERRED_IMPORTS = {
    # settings.py imports the hooks for every kedro command (kedro --help, kedro viz); the
    # strategy and device checks pull in the training engine (torch, transformers: seconds),
    # the schemas pydantic models and the task worlds' tables (pandas).
    ("creditflow.hooks.parameter_check", "creditflow.models.builders"),
    ("creditflow.hooks.parameter_check", "creditflow.pipelines.comparison"),
    ("creditflow.hooks.parameter_check", "creditflow.pipelines.parameters"),
    ("creditflow.hooks.parameter_check", "creditflow.training.strategies"),
    # The chain's schemas import pandas and the annotation clients; a tapo / tor run's check
    # does without.
    ("creditflow.pipelines.parameters", "creditflow.pipelines.chain_parameters"),
    # Likewise for the raw data check: the ingest loaders pull in pandas.
    ("creditflow.hooks.raw_data", "creditflow.pipelines.data_ingest.pipeline"),
    # ... and for the task sources' CSV header check.
    ("creditflow.hooks.task_source", "creditflow.ingest.source_rows"),
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool  # under a def (or a class body), not at module level
    has_reason: bool  # a comment on its line (beyond a bare noqa) or on the line above


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    found = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= {id(child) for child in ast.walk(node)}
    return found


def _has_reason(lines: list[str], node: ast.stmt) -> bool:
    line = lines[node.end_lineno - 1]
    comment = line.split("#", 1)[1] if "#" in line else ""
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return above.startswith("#") or len(re.sub(r"noqa: *PLC0415", "", comment).strip(" -")) > 3


def _all_imports(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every import statement of ``path`` (the whole tree, not only the module body), except
    those under ``if TYPE_CHECKING``. ``from pkg import submodule`` imports the submodule; the
    package counts only when a name is taken from its ``__init__``. Third-party imports are
    kept with the module name as written."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    skip = _type_checking_nodes(tree)
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{name}: relative import on line {node.lineno}")
            targets = []
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                targets.append(submodule if submodule in modules else node.module)
        else:
            targets = [alias.name for alias in node.names]
        for target in targets:
            found.append(
                Import(name, target, node.lineno, id(node) not in top, _has_reason(lines, node))
            )
    return found


def _project_graph(imports: list[Import], modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for imp in imports:
        if imp.imported in modules and imp.imported != imp.importer:
            graph[imp.importer].add(imp.imported)
    return graph


def _top(module: str) -> str:
    """``creditflow.training.grpo`` -> ``training``; the package itself -> ``__init__``."""
    return module.split(".")[1] if "." in module else "__init__"


def _layer_of(top: str) -> int:
    for rank, (_, members) in enumerate(LAYERS):
        if top in members:
            return rank
    raise AssertionError(f"creditflow.{top} is in no layer of LAYERS: add it to the table")


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` edges against LAYERS / PEER_IMPORTS."""
    bad = []
    for importer, imported_set in graph.items():
        for imported in imported_set:
            a, b = _top(importer), _top(imported)
            if a == b or b in PEER_IMPORTS.get(a, set()):
                continue
            if _layer_of(b) >= _layer_of(a):
                bad.append(f"{importer} -> {imported}")
    return sorted(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def _project_imports() -> tuple[dict[str, Path], list[Import]]:
    modules = _modules()
    imports = [imp for name, path in modules.items() for imp in _all_imports(name, path, modules)]
    return modules, imports


def test_no_import_circle_function_level_imports_included():
    modules, imports = _project_imports()
    assert _cycles(_project_graph(imports, modules)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_planted_function_level_circle_is_found(tmp_path):
    """Two modules that import each other, one of them inside a function: the walk sees the
    hidden arrow, so the circle is reported."""
    package = tmp_path / "creditflow"
    package.mkdir()
    (package / "one.py").write_text("from creditflow.two import g\n\ndef f():\n    return g()\n")
    (package / "two.py").write_text(
        "def g():\n    from creditflow.one import f  # noqa: PLC0415\n\n    return f\n"
    )
    modules = {"creditflow.one": package / "one.py", "creditflow.two": package / "two.py"}
    imports = [imp for n, p in modules.items() for imp in _all_imports(n, p, modules)]
    assert [imp.in_function for imp in imports] == [False, True] or [
        imp.in_function for imp in imports
    ] == [True, False]
    assert _cycles(_project_graph(imports, modules)) == [["creditflow.one", "creditflow.two"]]


def test_every_package_is_in_a_layer_and_imports_only_below_it():
    modules, imports = _project_imports()
    for name in modules:
        _layer_of(_top(name))
    assert _layer_violations(_project_graph(imports, modules)) == []


def test_the_layer_check_reports_an_upward_import():
    graph = {"creditflow.training.grpo": {"creditflow.chain.reranker.page_reward"}}
    assert _layer_violations(graph) == [
        "creditflow.training.grpo -> creditflow.chain.reranker.page_reward"
    ]


def _chain_part(module: str) -> str:
    """``creditflow.chain.reranker.model`` -> ``reranker``; ``creditflow.chain`` -> ``__init__``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def _chain_rank(part: str) -> int:
    for rank, members in enumerate(CHAIN_LAYERS):
        if part in members:
            return rank
    raise AssertionError(f"creditflow.chain.{part} is in no rank of CHAIN_LAYERS: add it")


def _chain_violations(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` edges between the chain's sub-packages against CHAIN_LAYERS."""
    bad = []
    for importer, imported_set in graph.items():
        if _top(importer) != "chain":
            continue
        for imported in imported_set:
            if _top(imported) != "chain":
                continue
            a, b = _chain_part(importer), _chain_part(imported)
            if a != b and _chain_rank(b) > _chain_rank(a):
                bad.append(f"{importer} -> {imported}")
    return sorted(bad)


def test_the_chain_sub_packages_import_only_below_them():
    modules, imports = _project_imports()
    for name in modules:
        if _top(name) == "chain":
            _chain_rank(_chain_part(name))
    assert _chain_violations(_project_graph(imports, modules)) == []


def test_the_chain_check_reports_an_upward_import():
    graph = {"creditflow.chain.annotation.schema": {"creditflow.chain.expmodel.data"}}
    assert _chain_violations(graph) == [
        "creditflow.chain.annotation.schema -> creditflow.chain.expmodel.data"
    ]
    peers = {"creditflow.chain.clicks.logged": {"creditflow.chain.reranker.data"}}
    assert _chain_violations(peers) == []


def test_the_chain_lives_only_under_creditflow_chain():
    """No module outside ``creditflow/chain/`` holds chain code: the chain's old homes are gone,
    and below the chain (the engine and what it builds on) nothing is named after it."""
    modules = _modules()
    elsewhere = {
        name
        for name in modules
        if any(name == old or name.startswith(f"{old}.") for old in CHAIN_MODULES_ELSEWHERE)
    }
    assert elsewhere == set()
    below = {
        str(path.relative_to(PACKAGE))
        for name, path in modules.items()
        if _layer_of(_top(name)) < _layer_of("chain")
        and re.search(r"(^|[._])(experience|annotation|expmodel|reranker|click_model)", name)
    }
    assert below == set()
    pairwise = {
        str(path.relative_to(PACKAGE))
        for name, path in modules.items()
        if _top(name) != "chain"
        and re.search(r"^def pairwise_preference_loss\b", path.read_text(encoding="utf-8"), re.M)
    }
    assert pairwise == set()


def test_the_bottom_layers_import_no_torch_and_only_what_they_may():
    _, imports = _project_imports()
    allowed = {
        "errors": {"__future__", "pathlib"},
        "io_atomic": {
            "__future__",
            "collections.abc",
            "contextlib",
            "os",
            "pathlib",
            "secrets",
            "typing",
        },
        "config": {
            "__future__",
            "collections.abc",
            "dataclasses",
            "difflib",
            "hashlib",  # config.plugins: the source digest of a strategy or reward of one's own
            "importlib",  # config.plugins: a strategy or reward named by import path
            "importlib.metadata",  # ... or by entry point
            "inspect",
            "math",  # config.values: a float parameter must be finite
            "numbers",
            "os",
            "pathlib",
            "re",
            "traceback",
            "types",
            "typing",
            "pydantic",
            "pydantic_core",
            "creditflow.errors",
        },
    }
    bad = []
    for imp in imports:
        top = "config" if imp.importer in CHAIN_BOTTOM else _top(imp.importer)
        if top in allowed and not (
            imp.imported in allowed[top] or imp.imported.startswith("creditflow.config")
        ):
            bad.append(f"{imp.importer}:{imp.line} imports {imp.imported}")
    assert bad == []


def test_function_level_imports_of_the_project_are_only_the_documented_ones():
    _, imports = _project_imports()
    hidden = {
        (imp.importer, imp.imported)
        for imp in imports
        if imp.in_function and imp.imported.startswith("creditflow")
    }
    assert hidden == DEFERRED_IMPORTS


def test_function_level_third_party_imports_say_why():
    _, imports = _project_imports()
    silent = [
        f"{imp.importer}:{imp.line} ({imp.imported})"
        for imp in imports
        if imp.in_function and not imp.imported.startswith("creditflow") and not imp.has_reason
    ]
    assert silent == []


def test_only_settings_imports_the_hooks():
    _, imports = _project_imports()
    importers = {
        imp.importer
        for imp in imports
        if imp.imported.startswith("creditflow.hooks") and _top(imp.importer) != "hooks"
    }
    assert importers == {"creditflow.settings"}


def test_one_pipeline_never_imports_another_pipelines_nodes():
    _, imports = _project_imports()
    crossing = []
    for imp in imports:
        a, b = imp.importer.split("."), imp.imported.split(".")
        if a[1:2] == b[1:2] == ["pipelines"] and len(a) > 3 and len(b) > 3:
            if a[2] != b[2] and a[3] == "nodes":
                crossing.append(f"{imp.importer} -> {imp.imported}")
    assert crossing == []


def test_no_source_file_is_longer_than_the_limit():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_kedro_node_bodies_are_thin():
    long = []
    for path in sorted(PACKAGE.glob("pipelines/*/nodes.py")):
        for function in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(function, ast.FunctionDef) or function.name.startswith("_"):
                continue
            body = function.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            lines = body[-1].end_lineno - body[0].lineno + 1
            if lines > MAX_NODE_BODY_LINES:
                long.append(f"{path.parent.name}.{function.name}: {lines} lines")
    assert long == []


def test_backward_is_called_only_in_the_two_trainers():
    callers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"\.backward\(", path.read_text(encoding="utf-8"))
    }
    assert callers == BACKWARD_HOMES


def _typed_configs() -> list[type]:
    """Every pydantic model of creditflow's configs and strategy options (the schema blocks,
    documented by the YAML comments, aside): what the parameter reference reads."""
    for module in pkgutil.iter_modules(creditflow.config.__path__, "creditflow.config."):
        importlib.import_module(module.name)
    found, todo = [], [BaseModel]
    while todo:
        for child in todo.pop().__subclasses__():
            todo.append(child)
            if child.__module__.startswith("creditflow.") and not issubclass(child, Block):
                found.append(child)
    return found


def test_every_config_field_has_a_description():
    configs = {model.__name__ for model in _typed_configs()}
    assert {"GRPOConfig", "SupervisedConfig", "SFTConfig", "CreditInspection"} <= configs
    undescribed = [
        f"{model.__module__}.{model.__name__}.{name}"
        for model in _typed_configs()
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert undescribed == []


# A name that says which kind of policy it serves (``vl`` or ``text``) where a name of the same
# words without it, or with the other kind, exists too: a fork of one entry by kind. Text and
# vision-language go through one entry each (``training.policy_kinds`` holds what differs), so
# a new twin fails. Left, each with the reason it is not joined yet:
KIND_MARKERS = {"vl", "text"}
KNOWN_TWINS = {
    # The experience chain's text ExpModel for catalogues without covers (MovieLens) beside
    # the vision-language one: the same two stages on another prompt and model.
    frozenset({"expmodel_prompt", "text_expmodel_prompt"}),
    frozenset({"expmodel_prompts", "text_expmodel_prompts"}),
    frozenset({"expmodel_target", "text_expmodel_target"}),
    frozenset({"score_items", "score_text_items"}),
    frozenset({"train_expmodel_pft", "train_text_expmodel_pft"}),
    frozenset({"prompt_inputs", "vl_prompt_inputs"}),
    # The lean decoder of Qwen2.5-VL reuses the text one's (lean.py) and adds the 3-D rope and
    # the picture's features: an extension, not a copy.
    frozenset({"lean", "lean_vl"}),
    # Not a kind: the comparison table rendered as text for the log.
    frozenset({"comparison", "comparison_text"}),
}


def _kind_twins(names: set[str]) -> set[frozenset[str]]:
    """Pairs of ``names`` equal but for a kind marker (one has it, the other has the other
    marker or none)."""
    by_words: dict[tuple[str, ...], set[str]] = {}
    for name in names:
        words = tuple(w for w in name.split("_") if w.lower() not in KIND_MARKERS)
        by_words.setdefault(words, set()).add(name)
    twins = set()
    for group in by_words.values():
        marked = {n for n in group if set(n.lower().split("_")) & KIND_MARKERS}
        twins |= {frozenset({a, b}) for a in marked for b in group if a != b}
    return twins


def _public_names() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        names.add(path.stem)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
                names.add(node.name)
    return {n for n in names if not n.startswith("_")}


def test_text_and_vision_language_have_no_twin_entries():
    assert sorted(map(sorted, _kind_twins(_public_names()) - KNOWN_TWINS)) == []


def test_the_twin_finder_finds_a_planted_twin():
    planted = {"run_grpo", "run_vl_grpo", "evaluate_text_policy", "evaluate_vl_policy", "vlad"}
    assert _kind_twins(planted) == {
        frozenset({"run_grpo", "run_vl_grpo"}),
        frozenset({"evaluate_text_policy", "evaluate_vl_policy"}),
    }
