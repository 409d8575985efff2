import pytest
import torch

from creditflow.models import ATTN_IMPLEMENTATIONS, build_tiny_qwen2


def _prompts(tokenizer, questions):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]


def test_forward_gives_logits_over_the_tokenizer_vocabulary(tokenizer, tiny_model):
    enc = tokenizer(["Сколько яиц?", "How many eggs are left?"], return_tensors="pt", padding=True)
    logits = tiny_model(**enc).logits
    B, T = enc["input_ids"].shape
    assert logits.shape == (B, T, len(tokenizer))  # (B, T, V)
    assert torch.isfinite(logits).all()


def test_parameter_count_matches_the_qwen2_layout(tokenizer, tiny_model):
    V, h, inter = len(tokenizer), 64, 128
    kv = 2 * (h // 4)  # 2 key/value heads of head_dim 64 / 4 = 16 -> 32
    per_layer = (
        (h * h + h)  # q_proj with bias: 4160
        + 2 * (h * kv + kv)  # k_proj, v_proj with bias: 2 * 2080
        + h * h  # o_proj, no bias: 4096
        + 3 * h * inter  # gate, up, down: 24576
        + 2 * h  # two RMSNorms: 128
    )  # = 37120
    expected = V * h + 2 * per_layer + h  # tied embedding/head + 2 layers + final norm
    assert per_layer == 37120
    assert sum(p.numel() for p in tiny_model.parameters()) == expected
    untied = build_tiny_qwen2(tokenizer, tie_word_embeddings=False)
    assert sum(p.numel() for p in untied.parameters()) == expected + V * h


def test_ids_and_attention_come_from_the_tokenizer(tokenizer, tiny_model):
    config = tiny_model.config
    assert config.vocab_size == len(tokenizer)
    assert (config.pad_token_id, config.eos_token_id, config.bos_token_id) == (0, 2, None)
    generation = tiny_model.generation_config
    assert (generation.pad_token_id, generation.eos_token_id) == (0, 2)
    assert config._attn_implementation == "eager"
    assert not tiny_model.training


def test_same_seed_same_weights_other_seed_other_weights(tokenizer, tiny_model):
    again = build_tiny_qwen2(tokenizer, seed=0).state_dict()
    other = build_tiny_qwen2(tokenizer, seed=1).state_dict()
    for name, weight in tiny_model.state_dict().items():
        torch.testing.assert_close(again[name], weight, rtol=0, atol=0)
    assert not torch.equal(other["model.embed_tokens.weight"], again["model.embed_tokens.weight"])


def test_build_leaves_the_global_rng_untouched(tokenizer):
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    build_tiny_qwen2(tokenizer, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(torch.rand(4), expected)


def test_sdpa_and_eager_agree(tokenizer, tiny_model):
    sdpa = build_tiny_qwen2(tokenizer, attn_implementation="sdpa")
    enc = tokenizer(
        _prompts(tokenizer, ["a", "Wie viele Eier?"]), return_tensors="pt", padding=True
    )
    mask = enc["attention_mask"].bool()
    with torch.no_grad():
        eager_logits = tiny_model(**enc).logits[mask]
        sdpa_logits = sdpa(**enc).logits[mask]
    torch.testing.assert_close(sdpa_logits, eager_logits, rtol=1e-5, atol=1e-5)


def test_greedy_generation_is_the_same_left_padded_or_alone(tokenizer, tiny_model):
    prompts = _prompts(tokenizer, ["Сколько?", "How many eggs are left after breakfast?"])
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    assert batch["attention_mask"][0, 0] == 0  # the short prompt really is left-padded
    width = batch["input_ids"].shape[1]
    with torch.no_grad():
        together = tiny_model.generate(**batch, do_sample=False, max_new_tokens=8)
        for row, prompt in enumerate(prompts):
            alone = tokenizer([prompt], return_tensors="pt")
            single = tiny_model.generate(**alone, do_sample=False, max_new_tokens=8)
            n = alone["input_ids"].shape[1]
            assert together[row, width:].tolist() == single[0, n:].tolist()


def test_sampling_stops_at_eos_and_pads_finished_rows(tokenizer, tiny_model):
    prompts = _prompts(tokenizer, ["Сколько?", "How many eggs are left after breakfast?"])
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    eos, pad, max_new = tokenizer.eos_token_id, tokenizer.pad_token_id, 64
    torch.manual_seed(0)
    with torch.no_grad():
        # An untrained model puts ~1/V on eos; a +3.5 logit bias (~6% a step) makes both
        # rows finish well inside max_new_tokens. eos and pad come from generation_config.
        out = tiny_model.generate(
            **batch, do_sample=True, max_new_tokens=max_new, sequence_bias={(eos,): 3.5}
        )
    completions = out[:, batch["input_ids"].shape[1] :]  # (B, T)
    assert completions.shape[1] < max_new  # stopped because every row hit eos
    for row in completions.tolist():
        assert eos in row
        after = row[row.index(eos) + 1 :]
        assert after == [pad] * len(after)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hidden_size": 66}, "divisible by num_attention_heads"),
        ({"num_key_value_heads": 3}, "divisible by num_key_value_heads"),
        ({"attn_implementation": "flash_attention_2"}, "eager"),
    ],
)
def test_invalid_sizes_are_rejected(tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_tiny_qwen2(tokenizer, **kwargs)
    assert "sdpa" in ATTN_IMPLEMENTATIONS


@pytest.mark.gpu
def test_tiny_model_on_cuda_matches_cpu(tokenizer, tiny_model):
    cuda_model = build_tiny_qwen2(tokenizer, attn_implementation="sdpa").to("cuda")
    batch = tokenizer(
        _prompts(tokenizer, ["a", "Wie viele Eier?"]), return_tensors="pt", padding=True
    )
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        cpu_logits = tiny_model(**batch).logits[mask]
        cuda_logits = cuda_model(**batch.to("cuda")).logits[mask.to("cuda")].cpu()
        out = cuda_model.generate(**batch, do_sample=True, max_new_tokens=8)
    # TF32 / fused kernels on the GPU: agreement to ~1e-3, not bit for bit.
    torch.testing.assert_close(cuda_logits, cpu_logits, rtol=1e-3, atol=1e-3)
    assert out.shape[0] == 2 and out.device.type == "cuda"
