"""Kedro datasets for Hugging Face artifacts: models, tokenizers and processors.

Each artifact is a directory written by ``save_pretrained`` and read back by a
``from_pretrained`` class method. With ``versioned: true`` Kedro places it at
``<filepath>/<version>/<basename of filepath>/`` and loads the newest version unless one
is pinned::

    policy_checkpoint:
      type: creditflow.datasets.HFModelDataset
      filepath: data/06_models/policy
      versioned: true
      load_args:
        dtype: bfloat16

Only local paths are supported: ``save_pretrained`` writes to a directory on disk.

A save is atomic: it writes into a hidden folder beside the target
(``.<basename>.partial-<pid>-<random>``), flushes it to the disk and only then renames it to
``<basename>``. Kedro finds versions by that name, so a run killed mid-save leaves no
half-written version to become "the newest" (before, loading the stored warm start then failed
with ``no file named model.safetensors``); what it leaves is the hidden folder, which nothing
reads and which may be deleted.
"""

import contextlib
import importlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import transformers
from kedro.io.core import (
    AbstractVersionedDataset,
    DatasetError,
    Version,
    get_filepath_str,
    get_protocol_and_path,
)

from creditflow.models.lora import is_lora_directory, is_lora_model, load_lora, save_lora
from creditflow.models.tokenizer import load_tokenizer
from creditflow.training.checkpoint import fsync_path

_LOCAL_PROTOCOLS = ("file",)
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def resolve_pretrained_class(name: str) -> type:
    """The class whose ``from_pretrained`` loads an artifact.

    Args:
        name: a ``transformers`` attribute (``"AutoModelForCausalLM"``,
            ``"AutoModelForImageTextToText"``, ``"AutoProcessor"``) or a dotted import path
            (``"my_pkg.models.ScoreHeadModel"``).

    Raises:
        ValueError: the name does not resolve to a class with ``from_pretrained``.
    """
    hint = (
        "use a transformers auto class name (e.g. 'AutoModelForCausalLM', "
        "'AutoModelForImageTextToText', 'AutoTokenizer', 'AutoProcessor') or a dotted path "
        "to a class"
    )
    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name) if module_name else transformers
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for {name!r}; {hint}") from exc
    obj = getattr(module, attr, None)
    if not (isinstance(obj, type) and hasattr(obj, "from_pretrained")):
        raise ValueError(f"{name!r} is not a class with from_pretrained; {hint}")
    return obj


class _HFDirectoryDataset(AbstractVersionedDataset[Any, Any]):
    """Shared path and version handling for ``save_pretrained`` directories."""

    _class_arg = "class"  # the constructor argument that names the loading class

    def __init__(
        self,
        *,
        filepath: str,
        loader_class: str,
        version: Version | None,
        load_args: dict[str, Any] | None,
        save_args: dict[str, Any] | None,
    ) -> None:
        protocol, path = get_protocol_and_path(filepath, version)
        if protocol not in _LOCAL_PROTOCOLS:
            raise DatasetError(
                f"{type(self).__name__} saves with save_pretrained and needs a local "
                f"filepath; got protocol {protocol!r} in {filepath!r}"
            )
        super().__init__(filepath=PurePosixPath(path), version=version)
        self._protocol = protocol
        self._loader_name = loader_class
        self._loader = resolve_pretrained_class(loader_class)
        self._load_args = dict(load_args or {})
        self._save_args = dict(save_args or {})

    def _load_dir(self) -> str:
        directory = get_filepath_str(self._get_load_path(), self._protocol)
        # Without this, a missing version reaches from_pretrained, which takes the path for a
        # hub id and fails with "Repo id must be in the form ...".
        if not Path(directory).is_dir():
            raise DatasetError(
                f"no saved {type(self).__name__} at {directory}: check the version given to "
                "--load-versions (the run manifest lists the versions each run saved)"
            )
        return directory

    def _save_dir(self) -> str:
        return get_filepath_str(self._get_save_path(), self._protocol)

    @contextlib.contextmanager
    def _staged_save_dir(self) -> Iterator[Path]:
        """A hidden folder to write the artifact into, put in place as the save directory
        only when the block ends without error (module docstring); on an error it is removed."""
        final = Path(self._save_dir())
        final.parent.mkdir(parents=True, exist_ok=True)
        # Same parent, so the rename below never crosses file systems and is atomic.
        staging = final.parent / f".{final.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            yield staging
            _fsync_tree(staging)
            if final.exists():  # unversioned: replace the previous save (versioned never exist)
                previous = final.parent / f".{final.name}.replaced-{uuid.uuid4().hex[:8]}"
                final.rename(previous)
                try:
                    staging.rename(final)
                except OSError:
                    previous.rename(final)  # keep the previous save where it was
                    raise
                shutil.rmtree(previous, ignore_errors=True)
            else:
                staging.rename(final)
            fsync_path(final.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def _exists(self) -> bool:
        try:
            return Path(self._load_dir()).is_dir()
        except DatasetError:
            return False

    def _describe(self) -> dict[str, Any]:
        return {
            "filepath": self._filepath,
            "version": self._version,
            self._class_arg: self._loader_name,
            "load_args": self._load_args,
            "save_args": self._save_args,
        }


class HFModelDataset(_HFDirectoryDataset):
    """A ``transformers`` model saved as safetensors in a directory.

    Saving calls ``model.save_pretrained(directory, **save_args)``; transformers 5 writes
    safetensors only, and the save fails if no ``*.safetensors`` file appears (a custom
    ``save_pretrained`` falling back to pickle is refused rather than silently stored).
    Loading calls ``model_class.from_pretrained(directory, **load_args)``, e.g.
    ``load_args: {dtype: bfloat16, device_map: auto, attn_implementation: sdpa}``.

    A LoRA policy (a ``peft`` model, ``policy.lora``) is saved as its adapter in safetensors,
    plus its base model under ``base/`` when the base is not a checkpoint loadable by name (a
    tiny policy); it loads back with trainable adapters (``models.lora``).

    For models kept between nodes in memory, use ``MemoryDataset`` with
    ``copy_mode: assign``; this dataset is for checkpoints that should outlive the run.
    """

    _class_arg = "model_class"

    def __init__(
        self,
        filepath: str,
        version: Version | None = None,
        load_args: dict[str, Any] | None = None,
        save_args: dict[str, Any] | None = None,
        model_class: str = "AutoModelForCausalLM",
    ) -> None:
        """
        Args:
            filepath: the directory the model is saved into (local).
            version: set by Kedro from ``versioned: true``; ``None`` for unversioned.
            load_args: keyword arguments of ``from_pretrained``.
            save_args: keyword arguments of ``save_pretrained`` (e.g. ``max_shard_size``).
            model_class: a transformers auto-class name or a dotted path to a class.
        """
        super().__init__(
            filepath=filepath,
            loader_class=model_class,
            version=version,
            load_args=load_args,
            save_args=save_args,
        )

    def load(self) -> transformers.PreTrainedModel:
        return self._load_model(self._load_dir())

    def save(self, data: transformers.PreTrainedModel) -> None:
        with self._staged_save_dir() as directory:
            self._save_model(data, directory)

    def _load_model(self, directory: str | Path) -> transformers.PreTrainedModel:
        """``model_class.from_pretrained(directory, **load_args)``; a LoRA directory
        (``models.lora.save_lora``) loads its base model that way and the adapter onto it."""
        if is_lora_directory(directory):
            return load_lora(
                directory, lambda base: self._loader.from_pretrained(base, **self._load_args)
            )
        return self._loader.from_pretrained(directory, **self._load_args)

    def _save_model(self, model: transformers.PreTrainedModel, directory: str | Path) -> None:
        """``model.save_pretrained(directory, **save_args)``; a LoRA (peft) model saves its
        adapter, and its base when that is not a checkpoint to load by name (``save_lora``)."""
        if is_lora_model(model):
            save_lora(model, directory, **self._save_args)
        else:
            model.save_pretrained(directory, **self._save_args)
        if not any(Path(directory).glob("*.safetensors")):
            raise DatasetError(
                f"{type(model).__name__}.save_pretrained wrote no *.safetensors file to "
                f"{directory}; refusing a checkpoint that would need pickle to load"
            )


class HFModelsBySeedDataset(HFModelDataset):
    """Models by seed (``{seed: model}``, the GRPO runs of one strategy of a comparison), each
    saved as ``HFModelDataset`` saves one, in its own ``seed_<seed>/`` subdirectory::

        <filepath>/<version>/<basename>/seed_0/{config.json, model.safetensors}
                                       /seed_1/...

    Loading returns every saved seed, in ascending order, each with
    ``model_class.from_pretrained(subdirectory, **load_args)``. Arguments as
    ``HFModelDataset``'s.
    """

    _SEED_DIR = "seed_"

    def load(self) -> dict[int, transformers.PreTrainedModel]:
        root = Path(self._load_dir())
        seeds = sorted(
            int(path.name.removeprefix(self._SEED_DIR))
            for path in root.iterdir()
            if path.is_dir() and path.name.removeprefix(self._SEED_DIR).lstrip("-").isdigit()
        )
        if not seeds:
            raise DatasetError(f"no seed_<seed>/ model directories in {root}")
        return {seed: self._load_model(root / f"{self._SEED_DIR}{seed}") for seed in seeds}

    def save(self, data: dict[int, transformers.PreTrainedModel]) -> None:
        if not data or not all(isinstance(seed, int) for seed in data):
            raise DatasetError(
                f"{type(self).__name__} saves a non-empty {{seed (int): model}} mapping; got "
                f"keys {list(data)[:5]}"
            )
        with self._staged_save_dir() as root:
            for seed, model in data.items():
                self._save_model(model, root / f"{self._SEED_DIR}{seed}")


class HFModelsByNameDataset(HFModelDataset):
    """Models by name (``{name: model}``, page GRPO's R_old variants), each saved as
    ``HFModelDataset`` saves one, in its own ``<name>/`` subdirectory; an empty mapping saves
    an empty folder and loads back empty. Names are letters, digits, ``_``, ``-`` and ``.``
    (a folder name on every system). Arguments as ``HFModelDataset``'s.
    """

    def load(self) -> dict[str, transformers.PreTrainedModel]:
        root = Path(self._load_dir())
        names = sorted(path.name for path in root.iterdir() if path.is_dir())
        return {name: self._load_model(root / name) for name in names}

    def save(self, data: dict[str, transformers.PreTrainedModel]) -> None:
        bad = [name for name in data if not (isinstance(name, str) and _SAFE_NAME.fullmatch(name))]
        if bad:
            raise DatasetError(
                f"{type(self).__name__} saves a {{name (str): model}} mapping whose names are "
                f"letters, digits, '_', '-' and '.'; got {bad[:5]}"
            )
        with self._staged_save_dir() as root:
            for name, model in data.items():
                self._save_model(model, Path(root) / name)


class HFTokenizerDataset(_HFDirectoryDataset):
    """A tokenizer (or, with ``processor_class: AutoProcessor``, a processor) directory.

    Saving calls ``save_pretrained(directory, **save_args)``. Loading with the default
    ``AutoTokenizer`` goes through ``creditflow.models.load_tokenizer``, which keeps a
    locally trained tokenizer exactly as saved; any other ``processor_class`` calls that
    class's ``from_pretrained(directory, **load_args)``.
    """

    _class_arg = "processor_class"

    def __init__(
        self,
        filepath: str,
        version: Version | None = None,
        load_args: dict[str, Any] | None = None,
        save_args: dict[str, Any] | None = None,
        processor_class: str = "AutoTokenizer",
    ) -> None:
        """
        Args:
            filepath: the directory the tokenizer is saved into (local).
            version: set by Kedro from ``versioned: true``; ``None`` for unversioned.
            load_args: keyword arguments of ``from_pretrained`` (e.g. ``padding_side``).
            save_args: keyword arguments of ``save_pretrained``.
            processor_class: ``AutoTokenizer``, ``AutoProcessor``, another transformers
                class name or a dotted path.
        """
        super().__init__(
            filepath=filepath,
            loader_class=processor_class,
            version=version,
            load_args=load_args,
            save_args=save_args,
        )

    def load(self) -> Any:
        if self._loader is transformers.AutoTokenizer:
            return load_tokenizer(self._load_dir(), **self._load_args)
        return self._loader.from_pretrained(self._load_dir(), **self._load_args)

    def save(self, data: Any) -> None:
        with self._staged_save_dir() as directory:
            data.save_pretrained(directory, **self._save_args)


def _fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` (and ``root``) to the disk, so the rename
    that makes it visible cannot reach the disk before its contents (a power loss)."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(Path(folder))
