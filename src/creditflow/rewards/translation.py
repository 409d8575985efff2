"""TAPO's translation reward: format-masked fidelity of the English pivot (docs/methods/tapo.md).

R_trans = F * chrF++(translation, reference English question) / 100, or F * XCOMET with
the optional ``unbabel-comet`` package. Lists are of length ``B`` (completions in a batch).
"""

import functools
from typing import Any

from sacrebleu.metrics import CHRF

from creditflow.rewards.format import extract_translation

TRANSLATION_METRICS = ("chrf++", "xcomet")
DEFAULT_XCOMET_MODEL = "Unbabel/XCOMET-XL"

# chrF++ is chrF with word unigrams and bigrams (word_order=2), sentence level (docs/methods/tapo.md).
# One object for the process: sentence_score keeps no state between calls.
_CHRF_PLUS_PLUS = CHRF(word_order=2)


def chrf_plus_plus(hypothesis: str, reference: str) -> float:
    """Sentence-level chrF++ of ``hypothesis`` against one ``reference``, in [0, 1].

    >>> chrf_plus_plus("How many eggs?", "How many eggs?")
    1.0
    """
    score = _CHRF_PLUS_PLUS.sentence_score(hypothesis, [reference]).score / 100.0
    return min(max(score, 0.0), 1.0)  # guard the [0, 1] contract against float round-off


def translation_reward(
    completions: list[str],
    references: list[str],
    metric: str = "chrf++",
    *,
    sources: list[str] | None = None,
    model_name: str = DEFAULT_XCOMET_MODEL,
    batch_size: int = 8,
) -> list[float]:
    """TAPO's translation reward R_trans = F * similarity(translation, reference) (docs/methods/tapo.md).

    A completion that fails the format reward F (see
    :func:`~creditflow.rewards.format.extract_translation`) scores 0.0 without being scored.

    Args:
        completions: ``B`` decoded completions.
        references: ``B`` reference English questions.
        metric: ``"chrf++"`` (sacrebleu ``CHRF(word_order=2)`` / 100) or ``"xcomet"``
            (needs ``pip install 'creditflow[comet]'``; checked before anything is scored).
        sources: ``B`` original-language questions, passed to XCOMET as ``src``
            (optional: XCOMET also scores reference-only); ignored by chrF++.
        model_name: the COMET checkpoint for ``"xcomet"``.
        batch_size: XCOMET's prediction batch size.

    Returns:
        ``B`` floats in [0, 1].

    >>> translation_reward(
    ...     ["<translation>How many eggs?</translation> 3", "How many eggs? 3"],
    ...     ["How many eggs?", "How many eggs?"],
    ... )
    [1.0, 0.0]
    """
    if metric not in TRANSLATION_METRICS:
        raise ValueError(
            f"unknown translation metric {metric!r}; valid: {list(TRANSLATION_METRICS)}"
        )
    if len(completions) != len(references):
        raise ValueError(
            f"got {len(completions)} completions but {len(references)} references; pass one "
            "reference English question per completion"
        )
    if sources is not None and len(sources) != len(completions):
        raise ValueError(f"got {len(sources)} sources for {len(completions)} completions")
    if metric == "xcomet":
        comet = _import_comet()  # fail before any work, not after a long batch
    translations = [extract_translation(c) for c in completions]
    scored = [i for i, t in enumerate(translations) if t is not None]
    rewards = [0.0] * len(completions)
    if metric == "chrf++":
        for i in scored:
            rewards[i] = chrf_plus_plus(translations[i], references[i])
    elif scored:
        samples = [
            {"mt": translations[i], "ref": references[i]}
            | ({} if sources is None else {"src": sources[i]})
            for i in scored
        ]
        scores = _xcomet_scores(comet, samples, model_name, batch_size)
        for i, score in zip(scored, scores, strict=True):
            rewards[i] = min(max(float(score), 0.0), 1.0)
    return rewards


def _import_comet() -> Any:
    try:
        import comet  # noqa: PLC0415 - optional extra, imported only when asked for
    except ImportError as err:
        raise ImportError(
            "metric='xcomet' needs the optional unbabel-comet package: "
            "pip install 'creditflow[comet]'"
        ) from err
    return comet


def _xcomet_scores(
    comet: Any, samples: list[dict[str, str]], model_name: str, batch_size: int
) -> list[float]:
    import torch  # noqa: PLC0415 - only the optional XCOMET path needs a device check

    model = _load_comet_model(comet, model_name)
    output = model.predict(
        samples, batch_size=batch_size, gpus=int(torch.cuda.is_available()), progress_bar=False
    )
    return list(output.scores)


@functools.cache
def _load_comet_model(comet: Any, model_name: str) -> Any:
    # Several GB for XCOMET-XL: load once per process.
    return comet.load_from_checkpoint(comet.download_model(model_name))
