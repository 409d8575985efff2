"""The project's own catalog replacements log no warning; anyone else's still do."""

import logging

from kedro.io import DataCatalog, MemoryDataset

from creditflow.hooks.console import quiet_known_noise, replace_dataset


def test_only_the_replacements_the_project_means_are_silent(caplog):
    quiet_known_noise()
    catalog = DataCatalog({"credentials": MemoryDataset({}), "other": MemoryDataset(1)})
    with caplog.at_level(logging.WARNING, logger="kedro.io.data_catalog"):
        replace_dataset(catalog, "credentials", MemoryDataset({"k": 1}))
        catalog["other"] = MemoryDataset(2)
    assert catalog.load("credentials") == {"k": 1}
    assert "Replacing dataset 'credentials'" not in caplog.text
    assert "Replacing dataset 'other'" in caplog.text


def test_the_omegaconf_deprecation_is_silenced(recwarn):
    import warnings  # noqa: PLC0415

    quiet_known_noise()
    warnings.warn("register_new_resolver() is deprecated and will be removed", stacklevel=1)
    assert not [w for w in recwarn if "register_new_resolver" in str(w.message)]


def test_mlflows_predict_type_hint_warning_is_dropped_where_the_cli_logs_warnings(caplog):
    # MLflow raises it under its own simplefilter("once"), which outranks any warning filter;
    # Kedro's CLI sends warnings to the py.warnings logger (logging.captureWarnings), where
    # the filter of quiet_known_noise drops it and nothing else.
    quiet_known_noise()
    logger = logging.getLogger("py.warnings")
    with caplog.at_level(logging.WARNING, logger="py.warnings"):
        logger.warning("%s", "\x1b[33mAdd type hints to the `predict` method to enable ...")
        logger.warning("%s", "a warning worth reading")
    assert [record.getMessage() for record in caplog.records] == ["a warning worth reading"]


def test_a_console_that_is_no_terminal_is_wide_and_a_users_columns_win(monkeypatch):
    import io  # noqa: PLC0415

    from creditflow.hooks import console  # noqa: PLC0415

    monkeypatch.setattr(console.sys, "stdout", io.StringIO())
    monkeypatch.delenv("COLUMNS", raising=False)
    console.widen_log_console()
    assert console.os.environ["COLUMNS"] == str(console.NO_TERMINAL_WIDTH)
    monkeypatch.setenv("COLUMNS", "120")
    console.widen_log_console()
    assert console.os.environ["COLUMNS"] == "120"
