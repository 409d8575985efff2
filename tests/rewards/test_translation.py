"""Translation reward R_trans = F * chrF++ / 100 (docs/methods/tapo.md), on real MGSM questions."""

import csv
import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sacrebleu.metrics import CHRF

from creditflow.rewards import TRANSLATION_METRICS, translation_reward
from creditflow.rewards import translation as translation_module


def _mgsm_questions(raw_data, language):
    with open(raw_data / "mgsm" / f"mgsm_{language}.tsv", encoding="utf-8", newline="") as f:
        return [row[0] for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def _wrap(translation, reasoning="so the answer is \\boxed{1}"):
    return f"<translation>{translation}</translation> {reasoning}"


def test_english_question_against_itself_scores_one(raw_data):
    english = _mgsm_questions(raw_data, "en")
    assert len(english) == 250
    rewards = translation_reward([_wrap(q) for q in english], english)
    assert rewards == pytest.approx([1.0] * 250, abs=1e-9)


def test_german_question_against_english_scores_below_one(raw_data):
    english = _mgsm_questions(raw_data, "en")
    german = _mgsm_questions(raw_data, "de")
    rewards = translation_reward([_wrap(q) for q in german], english)
    assert all(0.0 <= r < 1.0 for r in rewards)


def test_matches_sacrebleu_chrf_plus_plus_loop(raw_data):
    english = _mgsm_questions(raw_data, "en")[:40]
    french = _mgsm_questions(raw_data, "fr")[:40]
    # Partial translations: the first half of each English question's words.
    hypotheses = [" ".join(q.split()[: len(q.split()) // 2]) for q in english] + french
    references = english + english
    rewards = translation_reward([_wrap(h) for h in hypotheses], references)
    chrf_pp, chrf = CHRF(word_order=2), CHRF()
    expected = [
        chrf_pp.sentence_score(h, [r]).score / 100
        for h, r in zip(hypotheses, references, strict=True)
    ]
    assert rewards == pytest.approx(expected, abs=1e-12)
    # word_order=2 (chrF++) is really in use: plain chrF differs on these inputs.
    plain = [
        chrf.sentence_score(h, [r]).score / 100 for h, r in zip(hypotheses, references, strict=True)
    ]
    assert max(abs(a - b) for a, b in zip(rewards, plain, strict=True)) > 1e-3


def test_format_masks_the_reward():
    question = "How many eggs does Janet sell?"
    completions = [
        _wrap(question),  # F = 1
        question + " \\boxed{9}",  # no block: F = 0 although the text is perfect
        f"<translation>{question}</translation>",  # no reasoning after it: F = 0
        _wrap(question) + _wrap(question),  # two blocks: F = 0
    ]
    assert translation_reward(completions, [question] * 4) == [1.0, 0.0, 0.0, 0.0]


def test_translation_text_is_stripped_before_scoring():
    question = "How many eggs?"
    assert translation_reward([_wrap(f"\n  {question} \n")], [question]) == [1.0]


def test_rejects_unknown_metric_and_mismatched_lengths():
    with pytest.raises(ValueError, match=r"unknown translation metric 'bleu'.*chrf\+\+.*xcomet"):
        translation_reward([_wrap("a")], ["a"], metric="bleu")
    with pytest.raises(ValueError, match="2 completions but 1 references"):
        translation_reward([_wrap("a"), _wrap("b")], ["a"])
    assert TRANSLATION_METRICS == ("chrf++", "xcomet")


def test_xcomet_without_comet_installed_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "comet", None)  # makes `import comet` raise ImportError

    def must_not_run(completion):
        raise AssertionError("scored before checking that comet is installed")

    monkeypatch.setattr(translation_module, "extract_translation", must_not_run)
    with pytest.raises(ImportError, match=r"pip install 'creditflow\[comet\]'"):
        translation_reward([_wrap("a")], ["a"], metric="xcomet")


def test_xcomet_scores_only_format_valid_completions(monkeypatch):
    calls = {}

    class FakeModel:
        def predict(self, samples, batch_size, gpus, progress_bar):
            calls.update(samples=samples, batch_size=batch_size, gpus=gpus)
            # A deterministic stand-in score; 1.5 checks the clamp to [0, 1].
            return types.SimpleNamespace(scores=[1.5 if s["mt"] == "x" else 0.25 for s in samples])

    def download_model(name):
        calls["name"] = name
        return f"/ckpt/{name}"

    def load_from_checkpoint(path):
        calls["path"] = path
        return FakeModel()

    fake = types.ModuleType("comet")
    fake.download_model, fake.load_from_checkpoint = download_model, load_from_checkpoint
    monkeypatch.setitem(sys.modules, "comet", fake)

    completions = [_wrap("a"), "a \\boxed{1}", _wrap("x")]
    rewards = translation_reward(
        completions,
        ["A", "A", "X"],
        metric="xcomet",
        sources=["s0", "s1", "s2"],
        model_name="Unbabel/XCOMET-XXL",
        batch_size=4,
    )
    assert rewards == [0.25, 0.0, 1.0]
    assert calls["samples"] == [
        {"mt": "a", "ref": "A", "src": "s0"},
        {"mt": "x", "ref": "X", "src": "s2"},
    ]
    assert calls["name"] == "Unbabel/XCOMET-XXL" and calls["path"] == "/ckpt/Unbabel/XCOMET-XXL"
    assert calls["batch_size"] == 4 and calls["gpus"] in (0, 1)


GARBAGE = [
    "",
    "<translation>",
    "</translation>",
    "<translation>\udcff</translation>\x00",
    "<translation>\x00</translation> \udcff",
    "<translation>" + "ab " * 20_000 + "</translation> end",
    "<translation><translation>a</translation></translation>b",
]


def test_garbage_never_raises_and_stays_in_unit_interval():
    rewards = translation_reward(GARBAGE, ["How many eggs?"] * len(GARBAGE))
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert rewards[:3] == [0.0, 0.0, 0.0] and rewards[-1] == 0.0


@given(st.text(), st.text(), st.text())
def test_arbitrary_text_never_raises(translation, reasoning, reference):
    rewards = translation_reward(
        [translation, _wrap(translation, reasoning)], [reference, reference]
    )
    assert all(0.0 <= r <= 1.0 for r in rewards)
