"""A small multilingual corpus and the tokenizer/model trained from it, shared by the tests."""

import pytest
import torch

from creditflow.models import build_tiny_qwen2, train_bpe_tokenizer

# Questions in the languages of MGSM plus TAPO-style answers, so the BPE learns merges in
# every script the policy sees.
CORPUS = [
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning.",
    "<translation>How many eggs are left?</translation> 16 - 3 = 13, so \\boxed{13}.",
    "Die Enten von Janet legen 16 Eier pro Tag. Wie viele Eier bleiben übrig?",
    "Утки Джанет несут 16 яиц в день. Сколько яиц остаётся?",
    "เป็ดของเจเน็ตวางไข่วันละ 16 ฟอง เหลือไข่กี่ฟอง",
    "珍妮特的鸭子每天下 16 个蛋。还剩多少个蛋？",
    "ジャネットのアヒルは1日に16個の卵を産みます。卵は何個残りますか？",
    "Los patos de Janet ponen 16 huevos por día. ¿Cuántos huevos quedan?",
    "Les canards de Janet pondent 16 œufs par jour. Combien d'œufs reste-t-il ?",
    "The total is 2,125 dollars, so the answer is \\boxed{2,125}.",
]
TAPO_TOKENS = ("<translation>", "</translation>")


@pytest.fixture(autouse=True, scope="package")
def _single_thread_torch():
    """Run these tiny models on one thread, then restore the setting.

    64-wide matmuls are far below what intra-op threading pays off for; on a shared CPU the
    OpenMP threads of a second worker spin and a 8-token generate goes from ~0.04 s to ~3 s.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return CORPUS * 20


@pytest.fixture(scope="session")
def tokenizer(corpus):
    return train_bpe_tokenizer(corpus, vocab_size=512, special_tokens=TAPO_TOKENS)


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    return build_tiny_qwen2(tokenizer)
