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
