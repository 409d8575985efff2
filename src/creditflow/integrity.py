"""Content hashes of dataset versions: a bit flipped on disk is an error naming the dataset and
the version, not a silently different table or model.

Kedro writes a versioned dataset to ``<filepath>/<version>/<name>`` (a file, or a folder for a
model or tokenizer) and never writes that version again. When a run saves a version, a
``<version>.sha256`` file beside its folder records the SHA-256 of every file it holds (beside,
not inside, so the version folder holds what Kedro wrote and nothing else); a later load of that
version checks them first. The run manifest records the same digests, and ``creditflow verify
<manifest>`` checks every dataset version a run read or wrote against them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kedro.io import AbstractVersionedDataset

DIGEST_SUFFIX = ".sha256"
# Files are hashed a chunk at a time, so a many-GiB model never sits in memory whole.
_CHUNK = 1 << 20


class DataIntegrityError(ValueError):
    """A dataset version's files differ from the SHA-256 recorded when it was saved."""


def local_path(dataset: Any) -> Path | None:
    """A dataset's local file or folder (its unversioned ``filepath``), or None for one with no
    local path (in memory, a remote store)."""
    filepath = getattr(dataset, "_filepath", None)  # Kedro has no public accessor for it
    protocol = getattr(dataset, "_protocol", "file")
    if filepath is None or protocol not in ("file", None):
        return None
    return Path(str(filepath))


def version_folder(dataset: Any, version: str | None) -> Path | None:
    """``<filepath>/<version>`` of a versioned local dataset, else None."""
    path = local_path(dataset)
    if path is None or version is None or not isinstance(dataset, AbstractVersionedDataset):
        return None
    return path / version


def digest_path(folder: Path) -> Path:
    """Where the digests of version ``folder`` are kept: ``<filepath>/<version>.sha256``."""
    return folder.with_name(folder.name + DIGEST_SUFFIX)


def file_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (or of ``root`` itself when it is a file), by path
    relative to ``root`` ("." for a file)."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {
        "." if path == root else path.relative_to(root).as_posix(): file_sha256(path)
        for path in files
    }


def file_sha256(path: Path) -> str:
    """The SHA-256 (hex) of a file's bytes, read a chunk at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def combined_digest(digests: dict[str, str]) -> str:
    """One SHA-256 over a version's file digests (what a manifest records)."""
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def record_version(folder: Path) -> str:
    """Write the digests of a version just saved (:func:`digest_path`); returns their combined
    digest."""
    digests = file_digests(folder)
    digest_path(folder).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    return combined_digest(digests)


def verify_version(folder: Path, name: str, expected: str | None = None) -> str:
    """The combined digest of ``folder``, checked against its :func:`digest_path` (and against
    ``expected``, a manifest's record, when given); a version saved before digests were
    recorded is only hashed.

    Raises:
        DataIntegrityError: naming the dataset, the version and the files that differ.
    """
    recorded_file = digest_path(folder)
    actual = file_digests(folder)
    if recorded_file.is_file():
        recorded = json.loads(recorded_file.read_text())
        changed = sorted(
            k for k in recorded.keys() | actual.keys() if recorded.get(k) != actual.get(k)
        )
        if changed:
            raise DataIntegrityError(
                f"dataset `{name}` version {folder.name}: {', '.join(changed)} differ from the "
                f"SHA-256 recorded when it was saved ({recorded_file}); the file is damaged: "
                "restore it, or delete the version folder and run the pipeline that saves it"
            )
    combined = combined_digest(actual)
    if expected is not None and combined != expected:
        raise DataIntegrityError(
            f"dataset `{name}` version {folder.name}: its content differs from the digest the "
            "run manifest recorded"
        )
    return combined


def run_versions(manifest: Mapping[str, Any]) -> dict[str, str]:
    """``{dataset: version}`` of every versioned dataset a run manifest says the run read or
    wrote (a version it wrote wins over one it read): the versions that belong together, such
    as a run's policies and the tokenizer they were trained with, for ``catalog.load(name,
    version=...)``."""
    records = manifest.get("datasets", {})
    versions: dict[str, str] = {}
    for operation in ("loaded", "saved"):
        for name, record in (records.get(operation) or {}).items():
            if record.get("version"):
                versions[name] = record["version"]
    return versions


def verify_manifest(manifest: dict[str, Any]) -> list[str]:
    """One line per dataset version a run manifest recorded a digest for: ``ok``, ``DAMAGED``
    (with why) or ``missing``; unversioned files are listed as not checked, since a later run
    rewrites them."""
    lines = []
    records = manifest.get("datasets", {})
    for operation in ("loaded", "saved"):
        for name, record in sorted((records.get(operation) or {}).items()):
            if not record.get("sha256") or not record.get("path"):
                continue
            path, version = Path(record["path"]), record.get("version")
            label = f"{operation} {name}" + (f" @ {version}" if version else "")
            if version is None:
                lines.append(f"{label}: not checked (unversioned: later runs rewrite it)")
            elif not path.is_dir():
                lines.append(f"{label}: missing ({path})")
            else:
                try:
                    verify_version(path, name, expected=record["sha256"])
                except DataIntegrityError as error:
                    lines.append(f"{label}: DAMAGED: {error}")
                else:
                    lines.append(f"{label}: ok")
    return lines
