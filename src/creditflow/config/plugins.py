"""Names of a researcher's own strategies and rewards: an import path or an entry point.

A strategy or reward the parameters name is a built-in name (the tables of
``training.strategies`` and ``rewards.registry``), an import path ``"package.module:attribute"``
(``attribute`` may be dotted: ``"module:Class.method"``), or the name of an entry point an
installed package declares in the group ``ENTRY_POINT_GROUPS[kind]``::

    [project.entry-points."creditflow.strategies"]
    high_entropy_only = "my_credit.strategies:high_entropy_only"

This module finds the object behind such a name and says what is wrong when it cannot: a
module that does not import, an attribute that is missing, an entry point that fails to load.
What the object must look like is the caller's business (``training.strategies.plugins``,
``rewards.plugins``). Standard library only, so the parameter checks can call it without the
engine; the user's module itself may of course import torch.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import traceback
from typing import Any

from creditflow.errors import ConfigError

# The entry-point group of each kind of plug-in.
ENTRY_POINT_GROUPS = {"strategy": "creditflow.strategies", "reward": "creditflow.rewards"}
PATH_HINT = (
    "put the folder holding the module on PYTHONPATH (or install its package) and name it "
    "as 'package.module:function'"
)


def at(key: str) -> str:
    """The start of a message about ``key``: ``"advantage.name: "``; nothing for no key (the
    parameter check names the key itself)."""
    return f"{key}: " if key else ""


def is_import_path(name: str) -> bool:
    """Whether ``name`` is written as an import path ``"module:attribute"``.

    >>> is_import_path("my_credit.rewards:brevity"), is_import_path("reasoning")
    (True, False)
    """
    return isinstance(name, str) and ":" in name


def entry_point_names(kind: str) -> list[str]:
    """The names installed packages register for ``kind`` (``strategy`` or ``reward``)."""
    return sorted(
        {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS[kind])}
    )


def load_plugin(name: str, kind: str, key: str) -> Any | None:
    """The object ``name`` refers to: the attribute of an import path, or the entry point of
    that name in ``kind``'s group; None when ``name`` is neither a path nor a registered
    entry point (the caller then lists the valid names).

    Args:
        name: as written in the parameters.
        kind: ``strategy`` or ``reward`` (``ENTRY_POINT_GROUPS``).
        key: the parameter key that holds ``name`` (``advantage.name``, ``rewards``), for the
            messages.

    Raises:
        ConfigError: naming ``key`` and ``name``, when the module does not import, the
            attribute is missing or the entry point fails to load; with the fix.
    """
    if is_import_path(name):
        return _from_path(name, key)
    group = ENTRY_POINT_GROUPS[kind]
    found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
    if not found:
        return None
    try:
        return found[0].load()
    except Exception as error:  # whatever the package's import raises
        raise ConfigError(
            f"{at(key)}{name!r} is the entry point {found[0].value!r} of group {group!r}, which "
            f"does not load ({_short(error)}); fix or reinstall the package that declares it"
        ) from error


def source_digests(names: list[str], kind: str) -> dict[str, str]:
    """name -> sha256 of the source file of the module each import path or entry point of
    ``names`` names (other names are skipped). The resumable checkpoints of a run key on it, so
    a run with an edited strategy or reward trains afresh instead of resuming the old code's
    run (code in modules that one imports is not covered)."""
    group = ENTRY_POINT_GROUPS[kind]
    digests = {}
    for name in names:
        if is_import_path(name):
            module_name = name.partition(":")[0]
        else:
            found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
            if not found:
                continue
            module_name = found[0].module
        path = getattr(importlib.import_module(module_name), "__file__", None)
        if path is not None:
            with open(path, "rb") as source:
                digests[name] = hashlib.sha256(source.read()).hexdigest()
    return digests


def _from_path(path: str, key: str) -> Any:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(
            f"{at(key)}{path!r} is no import path: write 'package.module:function' (both parts)"
        )
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise ConfigError(
                f"{at(key)}{path!r}: no module named {error.name!r} on the import path; {PATH_HINT}"
            ) from error
        raise ConfigError(
            f"{at(key)}{path!r}: module {module_name!r} does not import ({_short(error)}); "
            "install what it imports, or fix the import"
        ) from error
    except Exception as error:  # a user's module can raise anything while it imports
        raise ConfigError(
            f"{at(key)}{path!r}: module {module_name!r} does not import ({_short(error)}, "
            f"{_where(error)}); fix the module"
        ) from error
    for part in attribute.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))[:20]
            raise ConfigError(
                f"{at(key)}{path!r}: {getattr(obj, '__name__', module_name)!r} has no attribute "
                f"{part!r} (it has {public}); fix the name after the ':'"
            )
        obj = getattr(obj, part)
    return obj


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _where(error: BaseException) -> str:
    """``file, line N`` of the innermost frame of ``error``'s traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "no traceback"
    last = frames[-1]
    return f"{last.filename}, line {last.lineno}"
