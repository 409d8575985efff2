"""Config error messages echo what they were given readably: a 100 KB ``--params`` value is cut
(a message of a few hundred characters, not of 100,000 that the CLI's highlighter takes minutes
over), and an invisible character in a key shows as its escape."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from kedro.config import OmegaConfigLoader
from kedro.framework.session import KedroSession

from creditflow.config.schema import check_override_groups, readable, shown
from creditflow.errors import ConfigError
from creditflow.pipelines.parameters import GROUPS, check_parameters
from tests.kedro_project import NodeCounter, copy_project

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

HUGE = "x" * 100_000
CUT = " ... (100,002 characters in all)"  # the note after a cut repr of HUGE


@pytest.fixture(scope="module")
def conf_params(project_root: Path) -> dict:
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    return dict(loader["parameters"])


def _error(conf_params: dict, group: str, path: list[str], value: object) -> str:
    params = copy.deepcopy(conf_params[group])
    node = params
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ConfigError) as error:
        check_parameters({group: params})
    return str(error.value)


def test_shown_cuts_a_repr_to_200_characters_and_says_how_long_it_was() -> None:
    assert shown("short") == "'short'"
    assert shown(HUGE) == repr(HUGE)[:200] + CUT


@pytest.mark.parametrize(
    ("group", "path", "value", "echo"),
    [
        # a type error: the schema writes the value
        ("tapo", ["tasks", "n_train_per_language"], HUGE, repr(HUGE)[:200] + CUT),
        # a field's validator writes it
        ("tapo", ["tasks", "languages"], [HUGE], "unknown language 'xxxx"),
        # a block's validator writes it, inside a list
        ("data_ingest", ["mgsm_languages"], [HUGE], "got ['xxxx"),
        # an unknown key
        ("tapo", [HUGE], 1, "tapo: unknown key `xxxx"),
    ],
)
def test_a_100_000_character_value_gives_a_short_message(
    conf_params: dict, group: str, path: list[str], value: object, echo: str
) -> None:
    message = _error(conf_params, group, path, value)
    assert len(message) < 1000, message[:300]
    assert echo in message and "characters in all)" in message


def test_a_long_value_with_spaces_is_cut_with_its_line() -> None:
    line = readable("data_ingest: got ['" + "a b " * 25_000 + "']")
    # 19 characters before the value, 100,000 of it and 2 after; cut at 1,000.
    assert len(line) < 1100 and line.endswith(" ... (100,021 characters in all)")


def test_a_zero_width_space_in_a_key_shows_as_its_escape(conf_params: dict) -> None:
    with pytest.raises(ConfigError) as error:
        check_override_groups({"ta\u200bpo": {"seed": 1}}, GROUPS)
    assert str(error.value).startswith(
        "--params: unknown parameter group `ta\\u200bpo` (did you mean `tapo`?)"
    )
    message = _error(conf_params, "tapo", ["tas\u200bks"], {})
    assert "tapo: unknown key `tas\\u200bks` (did you mean `tasks`?)" in message
    assert "\u200b" not in message


def test_a_100_kb_params_value_fails_a_session_in_a_short_message(
    project_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `kedro run --params "tapo.tasks.n_train_per_language=<100 KB>"` does."""
    project = copy_project(project_root, tmp_path / "project", monkeypatch)
    counter = NodeCounter()
    overrides = {"tapo": {"tasks": {"n_train_per_language": HUGE}}, HUGE: 1}
    with KedroSession.create(project_path=project, runtime_params=overrides) as session:
        session._hook_manager.register(counter)
        with pytest.raises(ConfigError) as error:
            session.run(pipeline_names=["tapo"])
    assert str(error.value).startswith("--params: unknown parameter group `xxxx")
    assert len(str(error.value)) < 1000
    assert counter.started == []
