"""Build the GRPO benchmark's model once: TAPO tasks -> BPE tokenizer -> tiny Qwen2 -> DIR.

DIR then holds what ``grpo_step.py`` loads for both implementations, so creditflow and TRL
start from byte-identical weights, tokenizer and prompts:

- ``config.json``, ``model.safetensors``, ``generation_config.json``: a randomly initialised
  ``Qwen2ForCausalLM`` from ``creditflow.models.build_tiny_qwen2``;
- ``tokenizer.json``, ``tokenizer_config.json``: the BPE tokenizer (with the TAPO markers
  ``<translation>`` / ``</translation>`` as added tokens and a ChatML chat template);
- with ``--pad-vocab-to N``, the embedding (tied to the LM head) padded to N rows, as Qwen
  checkpoints pad theirs (Qwen2.5: 151,936 rows for a ~151.6k-token tokenizer); the tokenizer
  is unchanged, so the extra rows are ids no text encodes to (a sampled one decodes to
  nothing) but every forward still computes their logits: a (B, T, V) tensor at V = N;
- ``prompts.jsonl``: one ``{"id", "language", "prompt", "answer"}`` per line; ``prompt`` is the
  user turn (``tapo_prompt``, not yet chat-formatted), languages interleaved so that the first
  P lines span several languages.

Usage::

    .venv/bin/python benchmarks/make_tiny_model.py --out data/06_models/bench_tiny --seed 0
    # the same model at Qwen2.5's vocabulary size
    .venv/bin/python benchmarks/make_tiny_model.py --out /tmp/bench_model_152k --pad-vocab-to 151936
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from itertools import zip_longest
from pathlib import Path

import pandas as pd
import torch

from creditflow.models import build_tiny_qwen2, train_bpe_tokenizer
from creditflow.rewards import TRANSLATION_CLOSE, TRANSLATION_OPEN
from creditflow.tasks.tapo import (
    DEFAULT_LANGUAGES,
    format_tapo_target,
    generate_tapo_problems,
    tapo_prompt,
)

logger = logging.getLogger(__name__)

PROMPTS_FILE = "prompts.jsonl"


def tokenizer_corpus(problems: pd.DataFrame) -> list[str]:
    """Texts the tokenizer is trained on: every prompt and every gold TAPO completion."""
    prompts = [tapo_prompt(q) for q in problems["question"]]
    targets = [
        format_tapo_target(q, a, r)
        for q, a, r in zip(
            problems["question_en"], problems["answer"], problems["reasoning_en"], strict=True
        )
    ]
    return prompts + targets


def interleave_languages(problems: pd.DataFrame) -> pd.DataFrame:
    """Rows reordered round-robin over languages (en, de, ..., en, de, ...), so any prefix of
    the prompt file mixes scripts and prompt lengths the way a real batch does."""
    by_language = [group.index.tolist() for _, group in problems.groupby("language", sort=False)]
    order = [i for row in zip_longest(*by_language) for i in row if i is not None]
    return problems.loc[order].reset_index(drop=True)


def write_prompts(problems: pd.DataFrame, path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in problems.itertuples(index=False):
            record = {
                "id": row.id,
                "language": row.language,
                "prompt": tapo_prompt(row.question),
                "answer": row.answer,
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def pad_vocabulary(model, rows: int, seed: int) -> None:
    """Pad ``model``'s (tied) input embedding and LM head to ``rows`` rows in place.

    ``resize_token_embeddings`` keeps the existing rows and initialises the new ones from the
    old rows' mean and covariance (``mean_resizing``), seeded here so the same seed gives
    the same weights; the tied LM head follows the embedding.
    """
    vocab = model.get_input_embeddings().weight.shape[0]
    if rows < vocab:
        raise ValueError(f"--pad-vocab-to {rows} is below the vocabulary size {vocab}")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model.resize_token_embeddings(rows)


def make_tiny_model(
    out: Path,
    *,
    seed: int = 0,
    n_problems: int = 32,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 512,
    pad_vocab_to: int | None = None,
) -> Path:
    """Build and save the benchmark model, tokenizer and prompts to ``out``; returns ``out``.

    Args:
        out: target directory (created; existing files of the same names are overwritten).
        seed: seeds the TAPO problems and the model weights.
        n_problems: TAPO problems per language (tokenizer corpus and prompt pool).
        vocab_size: BPE vocabulary before the two TAPO markers are added.
        hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
            intermediate_size: the Qwen2 sizes (see ``build_tiny_qwen2``).
        pad_vocab_to: pad the embedding and LM head to this many rows (>= the tokenizer's
            length); None keeps V = len(tokenizer).
    """
    out.mkdir(parents=True, exist_ok=True)
    problems = interleave_languages(generate_tapo_problems(n_problems, languages, seed=seed))
    tokenizer = train_bpe_tokenizer(
        tokenizer_corpus(problems),
        vocab_size=vocab_size,
        special_tokens=(TRANSLATION_OPEN, TRANSLATION_CLOSE),
    )
    model = build_tiny_qwen2(
        tokenizer,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        seed=seed,
    )
    if pad_vocab_to is not None:
        pad_vocabulary(model, pad_vocab_to, seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_prompts(problems, out / PROMPTS_FILE)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "saved a %d-parameter Qwen2 (V=%d, tokenizer %d), its tokenizer and %d prompts to %s",
        n_params,
        model.config.vocab_size,
        len(tokenizer),
        len(problems),
        out,
    )
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-problems", type=int, default=32, help="TAPO problems per language")
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument(
        "--pad-vocab-to",
        type=int,
        default=None,
        metavar="N",
        help="pad the embedding / LM head to N rows (Qwen2.5: 151936); tokenizer unchanged",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    make_tiny_model(
        args.out,
        seed=args.seed,
        n_problems=args.n_problems,
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        pad_vocab_to=args.pad_vocab_to,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
