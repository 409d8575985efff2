"""Task sources from the catalog: ``tapo.tasks.source``, ``tor.tasks.source`` and
``grpo.tasks.source``;
and the experience chain's catalogue and logs: ``annotation.source.items``
and ``annotation.source.impressions``.

Kedro builds the pipelines before it reads ``--params``, so a parameter cannot choose a
node's input. The nodes that build tasks or tables therefore read one fixed input each
(:data:`TASK_SOURCES`: ``tapo_source_problems``, ``tor_source_problems``,
``grpo_source_prompts``, ``annotation_source_items``, ``annotation_source_impressions``), and :class:`TaskSourceHook`
puts under that name, when the catalog is created:

- for ``source: synthetic`` (the default): a MemoryDataset holding None; the node then runs
  the seeded generators;
- for any other value: the catalog dataset of that name, the same object (so versioning,
  ``--load-versions`` and the run's version pinning apply to it as to the name itself).

A source must declare its schema in its catalog entry, ``metadata: {task_schema: math_text}``
(tapo), ``{task_schema: visual}`` (tor), ``{task_schema: prompts}`` (grpo),
``{task_schema: ranking_items}`` or
``{task_schema: ranking_impressions}`` (annotation): that is how a name is known to be a task dataset
before anything loads, and how an unknown name's error lists the ones there are. The rows are
checked against the schema when the node loads them (:mod:`creditflow.ingest.source_rows`, :mod:`creditflow.chain.world.sources`).

A bad source fails only runs that read it, before their first node: the hook records the
problem when the catalog is created and raises it from ``before_pipeline_run``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SYNTHETIC = "synthetic"  # = creditflow.tasks.splits.SYNTHETIC (not imported: pandas, numpy)
SCHEMA_KEY = "task_schema"  # the catalog entry's metadata key naming its task schema


@dataclass(frozen=True)
class TaskSource:
    """The fixed node input a source parameter fills (``<group>.<path>``, ``tasks.source`` by
    default), and the task schema (``creditflow.ingest.schemas``: ``math_text``, ``visual``,
    ``prompts``, ``ranking_items``, ``ranking_impressions``) its datasets follow."""

    dataset: str
    schema: str
    group: str
    path: tuple[str, ...] = ("tasks", "source")

    @property
    def parameter(self) -> str:
        """The parameter's dotted name, e.g. ``tapo.tasks.source``."""
        return ".".join((self.group, *self.path))

    def value(self, tree: Mapping[str, Any]) -> Any:
        """The parameter's value in the parameters ``tree`` (``synthetic`` when unset)."""
        node: Any = tree.get(self.group)
        for key in self.path:
            if not isinstance(node, Mapping) or key not in node:
                return SYNTHETIC
            node = node[key]
        return node


TASK_SOURCES: Mapping[str, TaskSource] = {
    "tapo": TaskSource("tapo_source_problems", "math_text", "tapo"),
    "tor": TaskSource("tor_source_problems", "visual", "tor"),
    "grpo": TaskSource("grpo_source_prompts", "prompts", "grpo"),
    "annotation_items": TaskSource(
        "annotation_source_items", "ranking_items", "annotation", ("source", "items")
    ),
    "annotation_impressions": TaskSource(
        "annotation_source_impressions",
        "ranking_impressions",
        "annotation",
        ("source", "impressions"),
    ),
}


def task_datasets(conf_catalog: Mapping[str, Any], schema: str) -> list[str]:
    """The catalog entries whose ``metadata`` declares ``task_schema: <schema>``, sorted.

    >>> task_datasets({"a": {"metadata": {"task_schema": "visual"}}, "b": {}}, "visual")
    ['a']
    """
    return sorted(
        name
        for name, entry in conf_catalog.items()
        if isinstance(entry, Mapping)
        and isinstance(entry.get("metadata"), Mapping)
        and entry["metadata"].get(SCHEMA_KEY) == schema
    )


def source_problem(entry: str, source: Any, conf_catalog: Mapping[str, Any]) -> str | None:
    """Why ``TASK_SOURCES[entry]``'s parameter cannot be ``source``, or None when it can."""
    spec = TASK_SOURCES[entry]
    schema, parameter = spec.schema, spec.parameter
    if not isinstance(source, str):
        return None  # a type error: the parameter schema reports it (ParameterCheckHook)
    if source == SYNTHETIC:
        return None
    valid = task_datasets(conf_catalog, schema)
    if source in valid:
        return None
    listed = f"`{SYNTHETIC}` or one of the catalog's {schema} datasets: {', '.join(valid)}"
    declare = (
        f"a dataset of your own becomes a source with `metadata: {{{SCHEMA_KEY}: {schema}}}` "
        "in its catalog entry (docs/howto/own_data.md)"
    )
    if source in conf_catalog:
        return (
            f"{parameter}: `{source}` is in the catalog but its entry does not declare "
            f"`metadata: {{{SCHEMA_KEY}: {schema}}}`; use {listed}; {declare}"
        )
    guess = difflib.get_close_matches(source, valid, n=1, cutoff=0.6)
    hint = f" (did you mean `{guess[0]}`?)" if guess else ""
    return f"{parameter}: no catalog dataset `{source}`{hint}; use {listed}; {declare}"
