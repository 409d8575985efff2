"""Writes docs/reference/parameters.md: every key of every parameter group, its type, default
and description, generated from the schemas that check them before a run
(``creditflow.pipelines.parameters.all_schemas``).

A description comes from where the knob is documented: the field's own description in the
typed config the schema block is built from (``GRPOConfig``, ``SFTConfig`` ...) or its
docstring (``PolicySpec`` ...), followed by the comment above (or beside) the key in
``conf/base/parameters_<group>.yml`` (why conf/base sets that value); a key no typed config
describes takes the YAML's comment alone.

    python docs/gen_parameters.py [OUTPUT]     (default: docs/reference/parameters.md)
"""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic_core import PydanticUndefined

from creditflow.config.schema import Block
from creditflow.pipelines.parameters import all_schemas

ROOT = Path(__file__).resolve().parents[1]
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<rest>.*)$")


def yaml_comments(path: Path) -> dict[str, str]:
    """Dotted key path -> its comment: the comment lines right above the key (same indent)
    and a comment after its value. Reads the YAML as text: the comments are what matters."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = KEY_LINE.match(line)
        if not match:
            pending = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        path_key = ".".join(key for _, key in stack)
        inline = match["rest"].split(" #", 1)[1].strip() if " #" in match["rest"] else ""
        text = " ".join([*pending, inline]).strip()
        if text:
            found[path_key] = text
        pending = []
    return found


def docstring_entry(owner: Any, name: str) -> str:
    """The text a docstring gives ``name``: a line ``name: text`` (or ``a, name, b: text``)
    and the lines indented under it."""
    doc = (getattr(owner, "__doc__", None) or "").expandtabs()
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([\w, ]+):\s*(.*)$", line)
        if not match or name not in [n.strip() for n in match[2].split(",")]:
            continue
        indent, parts = len(match[1]), [match[3]]
        for follow in lines[i + 1 :]:
            if not follow.strip() or len(follow) - len(follow.lstrip()) <= indent:
                break
            parts.append(follow.strip())
        return " ".join(parts).strip()
    return ""


def type_name(hint: Any) -> str:
    """A reader's name for a field type: ``int >= 1``, ``float or null``, ``mapping``."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(hint)
        bounds = []
        for item in meta:
            for attr in getattr(item, "metadata", [item]):
                for op, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                    if getattr(attr, op, None) is not None:
                        bounds.append(f"{sign} {getattr(attr, op)}")
        return type_name(base) + (f" ({', '.join(bounds)})" if bounds else "")
    if origin in (typing.Union, types.UnionType):
        names = [type_name(arg) for arg in typing.get_args(hint) if arg is not type(None)]
        nullable = type(None) in typing.get_args(hint)
        return " or ".join(names) + (" or null" if nullable else "")
    if origin in (dict, typing.Mapping) or hint is dict:
        return "mapping"
    if origin in (list, tuple) or hint in (list, tuple):
        return "list"
    if isinstance(hint, type) and issubclass(hint, Block):
        return "mapping (below)"
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def blocks_in(hint: Any) -> list[tuple[str, type[Block]]]:
    """Nested blocks of a field type: ``("", B)`` for ``B`` or ``B | None``, ``("<name>", B)``
    for a mapping of names to ``B``."""
    if isinstance(hint, type) and issubclass(hint, Block):
        return [("", hint)]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return [found for arg in typing.get_args(hint) for found in blocks_in(arg)]
    if origin in (dict, typing.Mapping):
        args = typing.get_args(hint)
        if len(args) == 2 and blocks_in(args[1]):
            return [("<name>", block) for _, block in blocks_in(args[1])]
    return []


def default_text(field: Any) -> str:
    if field.default is PydanticUndefined:
        return "required" if field.default_factory is None else f"`{field.default_factory()!r}`"
    if isinstance(field.default, Block):
        return ""
    return f"`{field.default!r}`".replace("|", "\\|")


_UNSET = object()


def conf_value(conf: Any, key: str) -> Any:
    """The value ``conf`` (a group's ``conf/base`` YAML, group key included) sets at the
    dotted ``key``, or ``_UNSET``."""
    node = conf
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _UNSET
        node = node[part]
    return node


def value_text(field: Any, conf: Any, key: str) -> str:
    """What a run uses: the value ``conf/base`` sets, with the code default beside it where
    the two differ; the code default where ``conf/base`` sets nothing."""
    code = default_text(field)
    value = conf_value(conf, key)
    if value is _UNSET:
        return code
    if isinstance(value, dict):  # a block: its keys have rows of their own
        return "" if code == "required" else code
    shown = f"`{value!r}`".replace("|", "\\|")
    if code in ("", "required", shown):
        return shown
    return f"{shown} (code default: {code})"


def rows(prefix: str, block: type[Block], comments: dict[str, str], conf: Any = None) -> list[str]:
    out = []
    for name, field in block.model_fields.items():
        key = f"{prefix}.{name}"
        text = _description(
            field.description or docstring_entry(block.DOCUMENTED_BY, name), comments.get(key)
        )
        cells = [f"`{key}`", type_name(field.annotation), value_text(field, conf, key), text]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        for segment, nested in blocks_in(field.annotation):
            out += rows(f"{key}.{segment}" if segment else key, nested, comments, conf)
    return out


def _description(described: str, comment: str | None) -> str:
    """A key's text: where its typed config describes it, that description, with the YAML's
    comment on the value conf/base sets after it (why that value); else the YAML's comment."""
    if described and comment:
        return f"{described} (conf/base: {comment})"
    return described or comment or ""


def yaml_only_group(group: str, yaml_file: Path) -> list[str]:
    """The rows of a group no schema block describes (``tracking``: read by the MLflow hook
    itself), from its YAML file: each key, its value as the default, its comment."""
    values = yaml.safe_load(yaml_file.read_text(encoding="utf-8")) or {}
    comments = yaml_comments(yaml_file)
    lines = [f"## `{group}`", "", f"In `conf/base/parameters_{group}.yml`.", ""]
    lines += ["| key | type | value in conf/base | description |", "|---|---|---|---|"]

    def walk(prefix: str, node: Any) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}"
            if isinstance(value, dict):
                walk(path, value)
                continue
            cells = [f"`{path}`", type(value).__name__, f"`{value!r}`", comments.get(path, "")]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")

    walk(group, values.get(group) or {})
    return [*lines, ""]


def reference() -> str:
    parts = [
        "# Parameter reference",
        "",
        "Every key of every parameter group, generated from the schemas that check them "
        "before a run's first node (`creditflow.pipelines.parameters.all_schemas`); the "
        "descriptions come from `conf/base/parameters_<group>.yml` and the typed configs; the "
        "value is what `conf/base` sets (the code's default beside it where they differ). "
        "Set a key in `conf/local/parameters_<group>.yml` or with "
        '`kedro run --params "<group>.<key>=<value>"`.',
        "",
    ]
    schemas = all_schemas()
    for yaml_file in sorted((ROOT / "conf" / "base").glob("parameters_*.yml")):
        group = yaml_file.stem.removeprefix("parameters_")
        if group not in schemas:
            parts += yaml_only_group(group, yaml_file)
    for group, block in sorted(schemas.items()):
        yaml_file = ROOT / "conf" / "base" / f"parameters_{group}.yml"
        comments = yaml_comments(yaml_file) if yaml_file.is_file() else {}
        conf = yaml.safe_load(yaml_file.read_text(encoding="utf-8")) if yaml_file.is_file() else {}
        parts += [
            f"## `{group}`",
            "",
            f"In `conf/base/parameters_{group}.yml`.",
            "",
            "| key | type | value in conf/base | description |",
            "|---|---|---|---|",
            *rows(group, block, comments, conf),
            "",
        ]
    return "\n".join(parts)


if __name__ == "__main__":
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/reference/parameters.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(reference(), encoding="utf-8")
