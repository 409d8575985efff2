"""Schema blocks for parameter groups: unknown keys at any depth, wrong types and broken
cross-field rules fail before the first node, naming the key.

The pieces (pydantic, strict: YAML's ``true`` is no number, ``2.5`` no int, ``"5"`` no int;
an int is taken for a float):

- :class:`Block`, the base of every block: an unknown key is an error that lists the valid
  keys and suggests the closest one (``did you mean``), a renamed key says its new name.
- :func:`dataclass_block`: the block of a typed config that already has a home
  (``GRPOConfig``, ``SFTConfig``, ``SupervisedConfig`` ...): its field names, types and
  defaults, plus that config's own checks (its ``from_params``), so nothing is written twice.
- :func:`signature_block`: the block of options a node passes straight to a function as
  keyword arguments (its signature is the schema).
- :func:`problems` / :func:`check_group`: one group's parameters against its block, every
  problem on one line of a :class:`~creditflow.errors.ConfigError`.

The blocks of the project's parameter groups live in :mod:`creditflow.pipelines.parameters`;
:class:`creditflow.hooks.parameter_check.ParameterCheckHook` runs them before a run's first node.
"""

from __future__ import annotations

import difflib
import inspect
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from pydantic_core import PydanticCustomError

from creditflow.config.values import hint_names
from creditflow.errors import ConfigError

# Shorthands for the common constraints.
Count = Annotated[int, Field(ge=1)]  # a size or number of steps: >= 1
NonNegative = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
OpenFraction = Annotated[float, Field(gt=0.0, lt=1.0)]


# An echoed value is cut to this many characters (of its repr, where this module writes it): a
# pasted 100 KB `--params` value would otherwise fill the terminal, and the CLI's highlighter
# takes minutes over it. A validator writes the values it names itself, so in a finished line
# any run of more characters without a space is cut too, and a line past LINE_CHARS (a long
# value with spaces; no valid-keys list comes near it) is cut whole.
SHOWN_CHARS = 200
LINE_CHARS = 1000
_LONG_RUN = re.compile(rf"\S{{{SHOWN_CHARS + 1},}}")


def _cut(text: str, limit: int = SHOWN_CHARS) -> str:
    if len(text) <= limit:
        return text
    # The space keeps a cut value a run of SHOWN_CHARS: readable() does not cut it again.
    return f"{text[:limit]} ... ({len(text):,} characters in all)"


def shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARS` characters with a note of its length.

    >>> shown("x" * 100_000)[-37:]
    'xxxxx ... (100,002 characters in all)'
    """
    return _cut(repr(value))


def readable(line: str) -> str:
    r"""A message line as it should reach a terminal: invisible and control characters
    escaped as ``repr`` writes them (a zero-width space in a key reads ``\u200b``), long
    values cut (:data:`SHOWN_CHARS`, :data:`LINE_CHARS`).

    >>> readable("unknown key `ta\u200bsks`")
    'unknown key `ta\\u200bsks`'
    """
    line = "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in line)
    return _cut(_LONG_RUN.sub(lambda run: _cut(run[0]), line), LINE_CHARS)


def _closest(key: str, valid: Collection[str]) -> str | None:
    matches = difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_keys_message(keys: Sequence[str], valid: Collection[str], noun: str = "key") -> str:
    """``unknown key `n_itmes` (did you mean `n_items`?); valid keys: ...``.

    >>> unknown_keys_message(["n_itmes"], ["n_items", "seed"])
    'unknown key `n_itmes` (did you mean `n_items`?); valid keys: n_items, seed'
    """
    parts = []
    for key in keys:
        guess = _closest(key, valid)
        parts.append(f"`{key}`" + (f" (did you mean `{guess}`?)" if guess else ""))
    nouns = noun if len(keys) == 1 else f"{noun}s"
    shown = ", ".join(sorted(valid)) or "none"
    return f"unknown {nouns} {', '.join(parts)}; valid {noun}s: {shown}"


def _error(message: str) -> PydanticCustomError:
    # The message goes in as context: a template would read braces in it as placeholders.
    return PydanticCustomError("config", "{message}", {"message": message})


class Block(BaseModel):
    """A parameter block: strict types, no unknown keys (:func:`problems` words those errors
    with the valid keys and the closest one).

    ``RENAMED`` maps a key the block once took to the key it became, so an old override (a
    ``conf/local`` file, ``--params``) fails saying where it moved instead of as unknown.
    """

    # allow_inf_nan: YAML's `.inf` / `.nan` are floats to the loader, and an infinite beta or
    # learning rate trains a NaN policy without a word.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
    RENAMED: ClassVar[Mapping[str, str]] = {}
    # The typed config or function whose docstring documents the fields of a block built from
    # it (dataclass_block, signature_block); None for a block written by hand, whose fields
    # the YAML comments document.
    DOCUMENTED_BY: ClassVar[Any] = None


def _yaml_type(hint: Any) -> Any:
    """``hint`` as the YAML loader delivers it: a tuple or Sequence arrives as a list, a Path
    as a string, a Mapping as a dict; unions and Optionals map member by member."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Path:
        return str
    if origin in (typing.Union, types.UnionType):
        members = tuple(_yaml_type(a) for a in args)
        return typing.Union[members]  # noqa: UP007 - built from a runtime tuple
    if origin is tuple:
        inner = [a for a in args if a is not Ellipsis]
        return list[typing.Union[tuple(_yaml_type(a) for a in inner)]] if inner else list  # noqa: UP007
    if origin in (list, Sequence, Collection) or hint in (list, Sequence):
        return list[_yaml_type(args[0])] if args else list
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return dict[str, Any]
    return hint


def _with_check(
    name: str,
    field_specs: dict[str, Any],
    check: Callable[[dict[str, Any]], Any] | None,
    renamed: Mapping[str, str],
) -> type[Block]:
    validators = {}
    if check is not None:

        def run_check(self: Block) -> Block:
            try:
                check(self.model_dump(exclude_unset=True))
            except (ConfigError, ValueError, TypeError) as error:
                raise _error(str(error)) from error
            return self

        validators["check"] = model_validator(mode="after")(run_check)
    model = create_model(name, __base__=Block, __validators__=validators, **field_specs)
    model.RENAMED = dict(renamed)
    return model


def dataclass_block(
    cls: type,
    *,
    check: Callable[[dict[str, Any]], Any] | None = None,
    partial: bool = False,
    exclude: Collection[str] = (),
    extra_fields: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> type[Block]:
    """The block of the typed config ``cls`` (a dataclass or a pydantic model): its fields
    (less ``exclude``, plus ``extra_fields``: name -> ``(type, default)``) with their types,
    defaults and (a model's) descriptions.

    Args:
        check: called with the keys the user set (after the type checks); its ConfigError or
            ValueError becomes this block's error. Usually the config's ``from_params``.
        partial: every field optional (overrides of a config set elsewhere, such as a
            strategy's overrides of ``grpo``); ``check`` then sees only what was set.
        name: the model's name (default ``<cls>Block``).
    """
    specs: dict[str, Any] = {}
    for field_name, hint, default, description in _config_fields(cls):
        if field_name in set(exclude):
            continue
        given = {"default": None} if partial else default
        specs[field_name] = (_yaml_type(hint), Field(description=description, **given))
    specs.update(extra_fields or {})
    block = _with_check(name or f"{cls.__name__}Block", specs, check, getattr(cls, "RENAMED", {}))
    block.DOCUMENTED_BY = cls  # whose docstring describes the fields (the parameter reference)
    return block


def _config_fields(cls: type) -> list[tuple[str, Any, dict[str, Any], str | None]]:
    """``(name, type, default as Field keywords, description)`` of each field of ``cls``."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        out = []
        for field_name, info in cls.model_fields.items():
            if info.default_factory is not None:
                default = {"default_factory": info.default_factory}
            else:
                default = {"default": info.default}
            out.append((field_name, info.annotation, default, info.description))
        return out
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is neither a dataclass nor a pydantic model")
    hints = typing.get_type_hints(cls)
    out = []
    for item in fields(cls):
        if item.default is not MISSING:
            default = {"default": item.default}
        elif item.default_factory is not MISSING:
            default = {"default_factory": item.default_factory}
        else:
            default = {"default": ...}
        out.append((item.name, hints[item.name], default, None))
    return out


def signature_block(
    func: Callable, *, taken: Collection[str] = (), name: str | None = None
) -> type[Block]:
    """The block of the keyword options a node passes to ``func``: every argument other than
    the ``taken`` ones (which the node supplies), with its annotation and default; one
    without a default is required."""
    hints = typing.get_type_hints(func)
    specs: dict[str, Any] = {}
    for arg, parameter in inspect.signature(func).parameters.items():
        if arg in set(taken) or parameter.kind not in (
            parameter.POSITIONAL_OR_KEYWORD,
            parameter.KEYWORD_ONLY,
        ):
            continue
        hint = _yaml_type(hints.get(arg, Any))
        default = ... if parameter.default is parameter.empty else parameter.default
        specs[arg] = (hint, default)
    block = _with_check(name or f"{func.__name__}_options", specs, None, {})
    block.DOCUMENTED_BY = func
    return block


def _path(group: str, loc: tuple[Any, ...]) -> str:
    # pydantic adds the validator's kind to the location of some errors (a union member's
    # type, "function-after[...]"): those are not keys.
    keys = [str(part) for part in loc if not str(part).startswith(("function-", "is-instance"))]
    return ".".join([group, *keys])


def _describe(error: Mapping[str, Any]) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "missing":
        return "missing: set it in parameters"
    if kind == "config":
        return message
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    kind_of = type(error.get("input")).__name__
    return f"{message[0].lower()}{message[1:]}, got {shown(error.get('input'))} ({kind_of})"


PROBLEMS_HEADER = "invalid parameters (fix them in conf/ or with --params):\n  "


def _unwrap(hint: Any) -> Any:
    """The block, dict or list inside ``Annotated[...]`` / ``X | None``."""
    while True:
        origin = typing.get_origin(hint)
        if origin is Annotated:
            hint = typing.get_args(hint)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = members[0] if len(members) == 1 else hint
            if len(members) != 1:
                return hint
        else:
            return hint


def _block_at(schema: type[Block], loc: Sequence[Any]) -> type[Block] | None:
    """The block that holds the keys at ``loc`` (a dict's key or a list's index steps into
    its values), or None when ``loc`` leaves the schema."""
    current: Any = schema
    for part in loc:
        hint = _unwrap(current)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            if part not in hint.model_fields:
                return None
            current = hint.model_fields[part].annotation
        elif typing.get_origin(hint) in (dict, list):
            current = typing.get_args(hint)[-1]
        else:
            return None
    hint = _unwrap(current)
    return hint if isinstance(hint, type) and issubclass(hint, Block) else None


def _unknown_keys(group: str, schema: type[Block], loc: tuple, keys: list[str]) -> str:
    block = _block_at(schema, loc)
    renamed = block.RENAMED if block is not None else {}
    moves = [f"`{key}` is now `{renamed[key]}`" for key in keys if key in renamed]
    if moves:
        return f"{_path(group, loc)}: {'; '.join(moves)}: move the setting in your parameters"
    valid = list(block.model_fields) if block is not None else []
    return f"{_path(group, loc)}: {unknown_keys_message(keys, valid)}"


def problems(
    group: str, params: Any, schema: type[Block], context: Mapping[str, Any] | None = None
) -> list[str]:
    """What is wrong with ``params`` (the ``params:<group>`` dict, overrides applied) under
    ``schema``: one line per problem, starting with the dotted key, e.g. ``tapo.tasks:
    unknown key `n_train_per_langauge` (did you mean `n_train_per_language`?); ...``.
    ``context`` goes to the blocks' validators (pydantic's validation context)."""
    try:
        schema.model_validate(params, context=context)
    except ValidationError as error:
        errors = error.errors()
    else:
        return []
    unknown: dict[tuple, list[str]] = {}  # block location -> its unknown keys
    lines = []
    for e in errors:
        if e["type"] == "extra_forbidden":
            unknown.setdefault(tuple(e["loc"][:-1]), []).append(str(e["loc"][-1]))
        else:
            lines.append(f"{_path(group, e['loc'])}: {_describe(e)}")
    lines = [_unknown_keys(group, schema, loc, keys) for loc, keys in unknown.items()] + lines
    return list(dict.fromkeys(readable(line) for line in lines))


def validation_message(error: Any, model: type, prefix: str = "") -> str:
    r"""A pydantic ``ValidationError`` of a typed config ``model`` as one ConfigError message:
    the first problem, ``\`key\` must be int, got 'abc' (str)``, or the message of a
    check the model runs itself (a ConfigError raised in a validator)."""
    first = error.errors()[0]
    kind, loc = first["type"], first["loc"]
    if kind in ("value_error", "assertion_error") and not loc:
        return first["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    key = prefix + ".".join(str(part) for part in loc)
    value = first.get("input")
    if kind == "finite_number":
        return f"`{key}` must be a finite number, got {value!r}"
    if kind == "missing":
        return f"`{key}` is required: set it in parameters"
    if kind == "extra_forbidden":
        return f"unknown key `{key}`; valid keys: {', '.join(sorted(model.model_fields))}"
    field = model.model_fields.get(str(loc[0])) if loc else None
    if field is not None and len(loc) == 1:
        wanted = hint_names(field.annotation)
    else:
        wanted = first["msg"].removeprefix("Input should be ").removeprefix("a valid ")
    return f"`{key}` must be {wanted}, got {shown(value)} ({type(value).__name__})"


def check_override_groups(overrides: Mapping[str, Any], groups: Collection[str]) -> None:
    """ConfigError when a top-level name of the ``--params`` overrides is no parameter group of
    the conf (``groups``, base and the run's env merged): Kedro would add it as a group of
    its own that no node reads, and the run would go on with the value it meant to change.

    >>> check_override_groups({"tpao": {"grpo": {"steps": 2}}}, ["tapo", "tor"])
    Traceback (most recent call last):
      ...
    creditflow.errors.ConfigError: --params: unknown parameter group `tpao` (did you mean `tapo`?); valid parameter groups: tapo, tor (a group is a top-level key of conf/*/parameters*.yml)
    """
    unknown = [str(name) for name in overrides if name not in set(groups)]
    if unknown:
        raise ConfigError(
            readable(
                f"--params: {unknown_keys_message(unknown, groups, noun='parameter group')} (a "
                "group is a top-level key of conf/*/parameters*.yml)"
            )
        )


def check_group(group: str, params: Any, schema: type[Block]) -> None:
    """ConfigError listing :func:`problems`, if there are any."""
    found = problems(group, params, schema)
    if found:
        raise ConfigError(PROBLEMS_HEADER + "\n  ".join(found))
