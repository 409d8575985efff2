"""A hook's ConfigError / MissingInputsError reaches the command line as its message alone and
stays the same exception type for code that catches it."""

from __future__ import annotations

import click
import pytest

from creditflow.errors import ConfigError, MissingInputsError
from creditflow.hooks.refusal import as_refusal, refuses


@pytest.mark.parametrize("kind", [ConfigError, MissingInputsError])
def test_a_refusal_is_its_own_type_and_a_click_error_with_the_same_message(kind):
    refusal = as_refusal(kind("grpo.steps must be >= 1"))
    assert isinstance(refusal, kind) and isinstance(refusal, click.ClickException)
    assert str(refusal) == refusal.format_message() == "grpo.steps must be >= 1"
    assert refusal.exit_code == 1


def test_a_wrapped_hook_refuses_and_lets_other_errors_through():
    @refuses
    def check(value):
        if value == "config":
            raise ConfigError("bad key")
        raise KeyError(value)  # a bug, not a refusal: its traceback stays

    with pytest.raises(ConfigError, match="bad key") as refused:
        check("config")
    assert isinstance(refused.value, click.ClickException)
    with pytest.raises(KeyError) as bug:
        check("other")
    assert not isinstance(bug.value, click.ClickException)
