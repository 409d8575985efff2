"""The documentation site: the parameter reference covers every key of the shipped
configuration, ``mkdocs build --strict`` passes (no broken link or reference), and three pages
of the built site render in headless Chromium, served over loopback."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_viz import CHROMIUM, CHROMIUM_FLAGS

ROOT = Path(__file__).resolve().parents[1]
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_parameters", ROOT / "docs/gen_parameters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _conf_keys(path: Path) -> set[str]:
    """Dotted paths of the block-style keys of a parameters file (flow mappings such as
    ``{name: tapo}`` are values, not keys)."""
    keys, stack = set(), []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = KEY.match(line)
        if not match or line.lstrip().startswith("#"):
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        keys.add(".".join(key for _, key in stack))
    return keys


def test_the_parameter_reference_lists_every_key_of_the_shipped_conf():
    reference = _generator().reference()
    listed = set(re.findall(r"^\| `([^`]+)`", reference, flags=re.MULTILINE))
    missing = []
    for path in sorted((ROOT / "conf/base").glob("parameters_*.yml")):
        for key in _conf_keys(path) - {path.stem.removeprefix("parameters_")}:
            # a strategy's name is the user's: the reference lists strategies.<name>.*
            generic = re.sub(
                r"^(tapo|tor|grpo|credit_gym)\.strategies\.[^.]+", r"\1.strategies.<name>", key
            )
            generic = re.sub(
                r"^(reranker_pretrain)\.rerankers\.[^.]+", r"\1.rerankers.<name>", generic
            )
            generic = re.sub(
                r"^(reranker_grpo)\.r_old_variants\.[^.]+", r"\1.r_old_variants.<name>", generic
            )
            if generic not in listed and not any(k.startswith(generic + ".") for k in listed):
                missing.append(key)
    assert missing == []


def test_the_committed_reference_is_the_generated_one():
    """docs/reference/parameters.md is committed (it is linked from the README); a change to a
    schema or a YAML comment regenerates it: `python docs/gen_parameters.py`."""
    committed = (ROOT / "docs/reference/parameters.md").read_text(encoding="utf-8")
    assert committed == _generator().reference(), "run: python docs/gen_parameters.py"


def test_the_reference_takes_descriptions_from_the_yaml_and_the_typed_configs():
    reference = _generator().reference()
    rows = {
        row.split("|")[1].strip(" `"): row
        for row in reference.splitlines()
        if row.startswith("| `")
    }
    # A YAML comment (conf/base/parameters_tapo.yml) ...
    assert "Intra-op CPU threads" in rows["tapo.torch_threads"]
    # ... and the description of the config's field (GRPOConfig), then the YAML's comment on
    # the value conf/base sets.
    assert "KL coefficient" in rows["tapo.grpo.beta"]
    assert "(conf/base: TAPO keeps the policy near its warm start" in rows["tapo.grpo.beta"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    docs = tmp_path_factory.mktemp("docs_project")
    shutil.copytree(ROOT / "docs", docs / "docs", ignore=shutil.ignore_patterns("parameters.md"))
    shutil.copy(ROOT / "mkdocs.yml", docs / "mkdocs.yml")
    (docs / "docs/reference").mkdir(exist_ok=True)
    (docs / "docs/reference/parameters.md").write_text(_generator().reference(), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(docs / "site")],
        cwd=docs,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return docs / "site"


@pytest.mark.slow
def test_the_site_builds_strictly(site: Path):
    for page in ("index.html", "methods/tapo.html", "reference/parameters.html"):
        assert (site / page).is_file(), page
    # Opened from the file: every nav link names a page (a folder link would open a directory
    # listing over file://), and the search index comes as a script, not a fetch.
    html = (site / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'<a href="([^"#][^"]*)" class="md-nav__link', html)
    assert len(links) > 10 and all(link.endswith(".html") for link in links), links
    # ... and every one of them opens a page that is there.
    assert [link for link in links if not (site / link).is_file()] == []
    assert (site / "search" / "search_index.js").is_file()


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install -y chromium)"
)
@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("index.html", "creditflow"),
        ("methods/tapo.html", "sign-conflict rate"),
        ("reference/parameters.html", "tapo.grpo.steps"),
    ],
)
def test_three_pages_render_in_chromium_from_the_file(
    site: Path, tmp_path: Path, page: str, expected: str
):
    # As the README says to open it: site/index.html, no server.
    url = (site / page).as_uri()
    result = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", url],
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    dom = result.stdout
    # The material theme laid the page out (its content column) and the page's text is there.
    assert 'class="md-content"' in dom
    assert expected in dom


# Project-management references mean nothing to someone who cloned the repository: the code
# and docs describe the methods in their own words (docs/methods/) instead.
TRACKER_REFERENCE = re.compile(r"\bissues? ?#?\d+\b|\bSPEC(\.md)? ?(section|§)", re.IGNORECASE)


def test_no_tracked_file_cites_an_issue_number_or_the_spec():
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the tracked files are unknown")
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    offending = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yml", ".yaml", ".toml", ".sh", ".cfg", ".txt", ""}:
            continue
        if not path.is_file():
            continue
        for number, line in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        ):
            if TRACKER_REFERENCE.search(line):
                offending.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not offending, "\n".join(offending)


INTERVAL = re.compile(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]")
SPEED = re.compile(r"^Speed: .*?\n\n", re.MULTILINE | re.DOTALL)


def test_published_figures_come_from_the_results_pages():
    # Every interval the README and the docs home page quote is one that docs/results.md or
    # benchmarks/README.md (dated, with its command) reports, and the two pages quote the
    # same speed figures.
    sources = (ROOT / "docs/results.md").read_text(encoding="utf-8")
    sources += (ROOT / "benchmarks/README.md").read_text(encoding="utf-8")
    pages = {
        name: (ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "docs/index.md")
    }
    unsourced = {
        name: [figure for figure in INTERVAL.findall(text) if figure not in sources]
        for name, text in pages.items()
    }
    assert unsourced == {"README.md": [], "docs/index.md": []}
    speeds = {
        name: re.findall(r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x", SPEED.search(text)[0])
        for name, text in pages.items()
    }
    assert speeds["README.md"] == speeds["docs/index.md"] != []
    # The home page's percentages (the chain's CTR and long views) are the README's, so the
    # two never tell a reader different defaults.
    percent = re.compile(r"[+-]\d+(?:\.\d+)? %")
    home_only = [f for f in percent.findall(pages["docs/index.md"]) if f not in pages["README.md"]]
    assert home_only == []
