"""A credentials file that other users may read gets a warning naming it and the fix."""

import logging
from pathlib import Path
from types import SimpleNamespace

from creditflow.hooks.credentials import CredentialsHook, readable_by_others


def _context(conf: Path, env: str | None = None) -> SimpleNamespace:
    loader = SimpleNamespace(
        conf_source=str(conf), base_env="base", env=env, default_run_env="local"
    )
    return SimpleNamespace(config_loader=loader)


def test_a_world_readable_credentials_file_is_named_with_the_fix(tmp_path, caplog):
    for env in ("base", "local"):
        (tmp_path / env).mkdir()
    shared = tmp_path / "local" / "credentials.yml"
    shared.write_text("openai_annotator: {api_key: sk-test}\n")
    shared.chmod(0o644)
    private = tmp_path / "base" / "credentials.yml"
    private.write_text("{}\n")
    private.chmod(0o600)
    assert readable_by_others([shared, private]) == [(shared, 0o644)]
    with caplog.at_level(logging.WARNING):
        CredentialsHook().after_context_created(_context(tmp_path))
    assert f"{shared} is readable by other users (mode 644)" in caplog.text
    assert f"chmod 600 {shared}" in caplog.text
    assert str(private) not in caplog.text and "sk-test" not in caplog.text
    shared.chmod(0o600)
    caplog.clear()
    CredentialsHook().after_context_created(_context(tmp_path, env="local"))
    assert caplog.text == ""
