"""A large task source and a large tokenizer corpus show progress; the tiny worlds stay quiet."""

import pandas as pd

from creditflow.ingest import source_rows
from creditflow.models import tokenizer as tokenizer_module


def test_a_large_source_shows_a_progress_bar_per_checked_column(monkeypatch, capsys):
    monkeypatch.setattr(source_rows, "PROGRESS_ROWS", 3)
    frame = pd.DataFrame({"id": ["a", "b", "c"], "prompt": ["x", "y", "z"]})
    source_rows.prompt_rows(frame, "mine")
    assert "mine.id" in capsys.readouterr().err
    monkeypatch.setattr(source_rows, "PROGRESS_ROWS", 4)
    source_rows.prompt_rows(frame, "mine")
    assert "mine.id" not in capsys.readouterr().err


def test_the_tokenizer_shows_progress_for_a_large_corpus_only(monkeypatch):
    seen = []
    real = tokenizer_module.trainers.BpeTrainer

    def spy(**kwargs):
        seen.append(kwargs["show_progress"])
        return real(**kwargs)

    monkeypatch.setattr(tokenizer_module.trainers, "BpeTrainer", spy)
    monkeypatch.setattr(tokenizer_module, "LARGE_CORPUS", 2)
    tokenizer_module.train_bpe_tokenizer(["one two", "three"], vocab_size=300)
    tokenizer_module.train_bpe_tokenizer(["one two"], vocab_size=300)
    tokenizer_module.train_bpe_tokenizer(iter(["a generator has no length"]), vocab_size=300)
    assert seen == [True, False, False]
