"""params:credit_gym is checked before anything trains: the shipped conf passes; a misspelt
knob, an out-of-range dose or a baseline that is no strategy fail naming the key."""

from pathlib import Path

import pytest
import yaml

from creditflow.errors import ConfigError
from creditflow.pipelines.parameters import check_parameters

CONF = Path(__file__).resolve().parents[2] / "conf/base/parameters_credit_gym.yml"


def _params():
    return yaml.safe_load(CONF.read_text(encoding="utf-8"))["credit_gym"]


def test_the_shipped_conf_passes():
    check_parameters({"credit_gym": _params()})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["sweeps"].update(conflct=[0.1]), "conflct"),
        (lambda p: p["sweeps"].update(conflict=[0.0, 0.7]), "sweeps.conflict"),
        (lambda p: p.update(baseline="uniform"), "baseline 'uniform' is not a strategy"),
        (
            lambda p: p["strategies"].update(mine={"grpo": {"loss_type": "ppo"}}),
            "unknown loss_type 'ppo'",
        ),
        (
            lambda p: p["strategies"].update(mine={"grpo": {"seed": 3}}),
            r"may not set \['seed'\]",
        ),
    ],
)
def test_bad_parameters_fail_naming_the_key(change, message):
    params = _params()
    change(params)
    with pytest.raises(ConfigError, match=message):
        check_parameters({"credit_gym": params})
