"""Every strategy's options are a typed model whose every field says what it does: the one
place an option is described."""

import pytest

import creditflow.training.strategies  # noqa: F401 - registers every shipped strategy
from creditflow.errors import ConfigError
from creditflow.training.strategies.base import StrategyOptions, parse_options


def _all_options() -> list[type[StrategyOptions]]:
    found, todo = [], [StrategyOptions]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_option_of_every_shipped_strategy_has_a_description():
    options = _all_options()
    assert {"TapoOptions", "TorOptions", "GroupScaleOptions", "RandomTokensOptions"} <= {
        cls.__name__ for cls in options
    }
    undescribed = [
        f"{cls.__name__}.{name}"
        for cls in options
        for name, field in cls.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert undescribed == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "grpo", "scale_by_std": 1}, r"advantage.scale_by_std must be true or false"),
        ({"name": "grpo", "scale_by_sdt": True}, r"did you mean 'scale_by_std' for 'scale_by_sdt'"),
    ],
)
def test_a_bad_option_names_its_key_and_what_it_takes(spec, message):
    from creditflow.training.strategies.base import GroupScaleOptions  # noqa: PLC0415

    with pytest.raises(ConfigError, match=message):
        parse_options(spec, GroupScaleOptions, "advantage")
