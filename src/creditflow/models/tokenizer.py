"""A byte-level BPE tokenizer trained locally, shaped like Qwen2's.

No tokenizer can be downloaded here, so the embedded default trains one from the project's
own texts. It mirrors what the policy code relies on in a real Qwen2.5 tokenizer: byte-level
BPE with Qwen2's pre-tokenizer (every unicode string round-trips, digits are split one by
one), ``<|endoftext|>`` as pad, ``<|im_end|>`` as eos, no bos, a ChatML chat template, and
left padding for batched generation.
"""

import json
import os
from collections.abc import Iterable, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
# A corpus of at least this many texts trains with the tokenizers library's progress bar.
LARGE_CORPUS = 100_000
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
# Order fixes the ids: pad = 0, im_start = 1, im_end = 2 (Qwen2 has the same relative order).
CONTROL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN)

# Qwen2.5's ChatML layout without its default system prompt or tool calling:
# <|im_start|>{role}\n{content}<|im_end|>\n ... then <|im_start|>assistant\n to generate.
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

_BYTE_ALPHABET_SIZE = 256

# Qwen2's split pattern (transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX,
# copied so a transformers upgrade cannot silently change trained vocabularies). Using it
# matters beyond style: AutoTokenizer reloads any tokenizer saved next to a qwen2
# config.json as Qwen2Tokenizer, which rebuilds the pre-tokenizer with this pattern, and
# only a tokenizer trained with it encodes the same after that reload.
QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Classes that rebuild nothing on load: tokenizer.json is used exactly as saved.
_AS_SAVED_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


# A prompt: one user turn as text, or a conversation as chat messages (TRL's "conversational"
# prompts), each ``{"role": "system" | "user" | "assistant", "content": text}``.
Prompt = str | Sequence[Mapping[str, str]]


def chat_messages(prompt: Prompt) -> list[dict[str, str]]:
    """``prompt`` as the messages a chat template renders: text becomes one user turn, chat
    messages stay as they are (a system turn, a few-shot exchange, then the user's question).

    >>> chat_messages("2 + 2?")
    [{'role': 'user', 'content': '2 + 2?'}]
    >>> chat_messages(
    ...     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ... )
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
    """
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 1024,
    *,
    special_tokens: Sequence[str] = (),
    chat_template: str | None = DEFAULT_CHAT_TEMPLATE,
    min_frequency: int = 2,
    model_max_length: int = 512,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for ``transformers``.

    Args:
        texts: training corpus, consumed once.
        vocab_size: size of the BPE vocabulary including the 256 byte symbols and the three
            control tokens; the ``special_tokens`` are added on top, so
            ``len(tokenizer) <= vocab_size + len(special_tokens)``.
        special_tokens: extra marker strings, e.g. ``("<translation>", "</translation>")``
            for TAPO (docs/methods/tapo.md). They are *regular* added tokens (``special=False``):
            always one id each and never split, but part of the text, so
            ``decode(ids, skip_special_tokens=True)`` keeps them. The reward and segmentation
            code must see the markers in decoded completions.
        chat_template: Jinja chat template; the default is Qwen-style ChatML. ``None`` leaves
            the tokenizer without one.
        min_frequency: a pair must occur this often to be merged.
        model_max_length: the longest sequence the paired model accepts (its
            ``max_position_embeddings``).

    Returns:
        A fast tokenizer with ``<|endoftext|>`` (id 0) as pad, ``<|im_end|>`` (id 2) as eos,
        ``<|im_start|>`` (id 1) as an extra special token, no bos and left padding.
        The same ``texts`` and arguments always give the same vocabulary.
    """
    extra = list(dict.fromkeys(special_tokens))  # dedupe, keep order
    clashes = [token for token in extra if token in CONTROL_TOKENS or not token]
    if clashes:
        raise ValueError(
            f"special_tokens must be non-empty and must not repeat the built-in control "
            f"tokens {list(CONTROL_TOKENS)}; got {clashes}"
        )
    smallest = _BYTE_ALPHABET_SIZE + len(CONTROL_TOKENS)
    if vocab_size < smallest:
        raise ValueError(
            f"vocab_size must be at least {smallest} (256 byte symbols + "
            f"{len(CONTROL_TOKENS)} control tokens), got {vocab_size}"
        )
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")

    backend = Tokenizer(models.BPE())
    # No normalizer: Qwen2 adds NFC, which would break decode(encode(x)) == x for
    # decomposed text. add_prefix_space=False for the same reason (no invented space).
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(CONTROL_TOKENS),
        # The full byte alphabet, seen in the corpus or not, so no input is ever unknown.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # A bar only for a large corpus (a user's million rows), not the tiny task worlds.
        show_progress=isinstance(texts, Sized) and len(texts) >= LARGE_CORPUS,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in extra])

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=IM_END_TOKEN,
        bos_token=None,
        extra_special_tokens=[IM_START_TOKEN],
        padding_side="left",  # generation appends on the right, so prompts pad on the left
        model_max_length=model_max_length,
        # Cleanup would rewrite " ." as "." and break the round trip.
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def load_tokenizer(name_or_path: str | os.PathLike, **kwargs: Any) -> PreTrainedTokenizerBase:
    """Load a tokenizer the way it was saved.

    ``AutoTokenizer`` ignores the ``tokenizer_class`` a directory declares whenever a qwen2
    ``config.json`` sits beside it and rebuilds the tokenizer as ``Qwen2Tokenizer`` (NFC
    normalisation, its own pre-tokenizer). For a directory saved from
    ``train_bpe_tokenizer`` that would change how non-NFC text encodes, so a local
    directory declaring a plain fast tokenizer is loaded with that class; everything else
    (hub ids, real checkpoints) goes through ``AutoTokenizer``.

    Args:
        name_or_path: a Hugging Face id or a local directory.
        **kwargs: passed to ``from_pretrained`` (``padding_side``, ``trust_remote_code``...).
    """
    config_file = Path(name_or_path) / "tokenizer_config.json"
    if config_file.is_file():
        declared = json.loads(config_file.read_text(encoding="utf-8")).get("tokenizer_class")
        if declared in _AS_SAVED_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(name_or_path, **kwargs)
    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)
