import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from creditflow.models import (
    DEFAULT_CHAT_TEMPLATE,
    build_tiny_qwen2,
    load_tokenizer,
    train_bpe_tokenizer,
)
from tests.models.conftest import TAPO_TOKENS

MIXED_SCRIPT = [
    "How many eggs are left?",
    "Wie viele Eier bleiben übrig? Größe, Straße",
    "Сколько яиц остаётся? Ёж",
    "เหลือไข่กี่ฟอง",
    "还剩多少个蛋？",
    "卵は何個残りますか？ カタカナ",
    "0123456789 3.14159 -42",
    "\\boxed{2,125}",
    "  leading spaces, trailing  \n\n\ttabs\r\n",
    "emoji 😀👩‍👩‍👧 and e\u0301 (decomposed) vs é (composed)",
    "Mixed: 16 eggs = 16 Eier = 16 яиц = 16 ฟอง = 16 个蛋 = 16個",
]


@pytest.mark.parametrize("text", MIXED_SCRIPT)
def test_decode_inverts_encode_on_mixed_scripts(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


@given(st.text(max_size=80))
def test_decode_inverts_encode_for_any_unicode(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_control_tokens_have_fixed_ids_and_roles(tokenizer):
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        0,
        1,
        2,
    ]
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 0)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.bos_token is None
    assert tokenizer.padding_side == "left"
    assert tokenizer.model_max_length == 512
    # The extra markers are appended after the trained vocabulary, in the given order.
    assert tokenizer.convert_tokens_to_ids(list(TAPO_TOKENS)) == [
        len(tokenizer) - 2,
        len(tokenizer) - 1,
    ]


def test_translation_marker_is_one_token_and_survives_skip_special(tokenizer):
    open_id, close_id = tokenizer.convert_tokens_to_ids(list(TAPO_TOKENS))
    assert tokenizer.encode("<translation>") == [open_id]
    text = "<translation>How many eggs?</translation> \\boxed{13}"
    ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
    assert ids.count(open_id) == 1 and ids.count(close_id) == 1
    # eos is special and dropped; the TAPO markers are text and kept.
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(ids) == text + "<|im_end|>"


def test_im_start_is_skipped_as_special(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_digits_are_split_one_per_token_like_qwen2(tokenizer):
    # Qwen2's pre-tokenizer isolates every digit: "2125" -> "2", "1", "2", "5".
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("2125")) == ["2", "1", "2", "5"]


def test_chat_template_is_chatml(tokenizer):
    messages = [
        {"role": "system", "content": "Translate, then solve."},
        {"role": "user", "content": "Сколько яиц?"},
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nTranslate, then solve.<|im_end|>\n"
        "<|im_start|>user\nСколько яиц?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages[1:], tokenize=False)
    assert without == "<|im_start|>user\nСколько яиц?<|im_end|>\n"


def test_no_chat_template_when_disabled(corpus):
    tok = train_bpe_tokenizer(corpus[:10], vocab_size=300, chat_template=None)
    assert tok.chat_template is None
    assert DEFAULT_CHAT_TEMPLATE  # the default is a non-empty template string


def test_training_is_deterministic(corpus, tokenizer):
    again = train_bpe_tokenizer(corpus, vocab_size=512, special_tokens=TAPO_TOKENS)
    assert again.get_vocab() == tokenizer.get_vocab()
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()


def test_vocabulary_depends_on_the_corpus_and_respects_the_size(corpus, tokenizer):
    other = train_bpe_tokenizer([t.upper() for t in corpus], vocab_size=512)
    assert other.get_vocab() != tokenizer.get_vocab()
    # 256 bytes + 3 control tokens + 253 merges fill vocab_size (the corpus has enough
    # repeated pairs); the two markers come on top: 512 + 2.
    assert len(tokenizer) == 512 + len(TAPO_TOKENS)


def test_left_padding_puts_pads_before_the_prompt(tokenizer):
    batch = tokenizer(["hi", "How many eggs are left?"], padding=True)
    short, long_ = batch["input_ids"]
    n_pad = len(long_) - len(tokenizer.encode("hi"))
    assert short[:n_pad] == [0] * n_pad and short[n_pad:] == tokenizer.encode("hi")
    assert batch["attention_mask"][0] == [0] * n_pad + [1] * (len(long_) - n_pad)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocab_size": 100}, "at least 259"),
        ({"special_tokens": ["<|im_end|>"]}, "control tokens"),
        ({"special_tokens": [""]}, "non-empty"),
        ({"min_frequency": 0}, "min_frequency"),
    ],
)
def test_invalid_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        train_bpe_tokenizer(["abc"], **kwargs)


def test_reload_next_to_a_qwen2_config_encodes_the_same(tmp_path, tokenizer):
    build_tiny_qwen2(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == (
        "TokenizersBackend"
    )
    as_saved = load_tokenizer(tmp_path)
    # AutoTokenizer rebuilds it as Qwen2Tokenizer (adds NFC); with the Qwen2 split pattern
    # it still agrees on NFC text, but only load_tokenizer keeps decomposed text intact.
    auto = AutoTokenizer.from_pretrained(tmp_path)
    assert type(auto).__name__ == "Qwen2Tokenizer"
    for text in MIXED_SCRIPT:
        assert as_saved.encode(text) == tokenizer.encode(text)
        assert as_saved.decode(as_saved.encode(text)) == text
    nfc_text = "<translation>Сколько яиц?</translation> 16 个蛋 \\boxed{2,125}"
    assert auto.encode(nfc_text) == tokenizer.encode(nfc_text)
    assert as_saved.padding_side == "left" and as_saved.chat_template == tokenizer.chat_template
    assert as_saved.decode(as_saved.encode("<translation>x"), skip_special_tokens=True) == (
        "<translation>x"
    )
