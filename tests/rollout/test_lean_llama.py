"""The ``lean`` rollout backend and the shared-prefix update on Llama models (SmolLM2's
architecture) against transformers, and on LoRA (peft) policies against peft's own forward.

The tiny models mirror SmolLM2-135M's layout at toy sizes: ``LlamaForCausalLM``, tied
embeddings, no biases, GQA 3:1, RoPE theta 1e5, RMSNorm eps 1e-5; plus the Llama options
SmolLM2 does not use (attention and MLP biases, an untied head, a head size that is not
hidden / heads). Initialised with std 0.3 so the logits spread over several units.
"""

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import creditflow.rollout.backends as backends_module
from creditflow.rollout.backends import rollout_backend
from creditflow.rollout.backends.hf import HFBackend
from creditflow.rollout.backends.lean import LeanBackend
from creditflow.rollout.language_policy import LanguagePolicy, SamplingSettings
from tests.rollout.test_lean_backend import (
    PAD,
    V,
    hf_logits,
    lean_logits,
    left_padded_prompts,
    request,
)
from tests.rollout.test_shared_prefix import _batch, _compare

peft = pytest.importorskip("peft")

LLAMA_CONFIGS = {
    # SmolLM2-135M at toy sizes: tied, no bias, GQA 3:1 (head size 8), theta 1e5, eps 1e-5
    "smollm2_like": dict(
        hidden_size=48,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=128,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e5},
        rms_norm_eps=1e-5,
    ),
    # every projection with a bias, untied head, sdpa
    "biases_untied_sdpa": dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=48,
        num_hidden_layers=2,
        tie_word_embeddings=False,
        attention_bias=True,
        mlp_bias=True,
        attn_implementation="sdpa",
    ),
    # head size 12 though hidden / heads = 8, llama3 RoPE scaling
    "head_dim_llama3_rope": dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        intermediate_size=40,
        num_hidden_layers=2,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
}


def make_llama(name: str = "smollm2_like", seed: int = 0, vocab: int = V, **overrides):
    config = LlamaConfig(
        vocab_size=vocab,
        max_position_embeddings=128,
        initializer_range=0.3,
        pad_token_id=PAD,
        bos_token_id=None,
        eos_token_id=None,
        **{"attn_implementation": "eager", **LLAMA_CONFIGS[name], **overrides},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def with_lora(model, seed: int = 0, **options):
    """``model`` in a PeftModel whose adapters are random (``B`` not 0), so they change the
    logits; every linear layer adapted unless ``target_modules`` says otherwise."""
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=options.pop("target_modules", "all-linear"),
        init_lora_weights=False,
        **options,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = peft.get_peft_model(model, config)
    with torch.no_grad():  # peft's random B is small; make the adapters matter
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.mul_(20.0)
    return wrapped.eval()


# ------------------------------------------------------------------ Llama: logits and tokens
@pytest.mark.parametrize("name", sorted(LLAMA_CONFIGS))
def test_llama_every_step_logits_match_hf_forward(name):
    model = make_llama(name)
    assert LeanBackend().unsupported_reason(model) is None
    ids, mask = left_padded_prompts([7, 3, 5])
    G, T = 2, 8
    completion = torch.randint(1, V, (3 * G, T), generator=torch.Generator().manual_seed(1))
    expected = hf_logits(
        model, ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0), completion
    )
    torch.testing.assert_close(
        lean_logits(model, ids, mask, G, completion), expected, atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("name", sorted(LLAMA_CONFIGS))
def test_llama_seeded_sample_and_greedy_match_hf_backend(name):
    model = make_llama(name)
    ids, mask = left_padded_prompts([6, 2, 4], seed=7)
    sample = request(
        ids, mask, group_size=3, max_new_tokens=10, temperature=0.9, top_k=40, top_p=0.95
    )
    for r in (sample, request(ids, mask, group_size=2, max_new_tokens=10, do_sample=False)):
        torch.manual_seed(2)
        expected = HFBackend().generate(model, r)
        torch.manual_seed(2)
        actual = LeanBackend().generate(model, r)
        torch.testing.assert_close(actual.completion_ids, expected.completion_ids, rtol=0, atol=0)


def test_tied_head_is_the_embedding_not_a_copy():
    model = make_llama("smollm2_like")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    fused = LeanBackend().fused_weights(model, 0)
    assert fused.head.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert all(layer.qkv_bias is None and layer.o_bias is None for layer in fused.layers)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
            "dynamic",
        ),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
    ],
)
def test_unsupported_llama_configs_are_refused(overrides, words):
    model = make_llama(**overrides)
    reason = LeanBackend().unsupported_reason(model)
    assert reason is not None and words in reason
    assert isinstance(rollout_backend({"name": "lean"}, model), HFBackend)


# ------------------------------------------------------------------ Llama: shared prefix
def test_llama_shared_prefix_equals_the_plain_forward(tapo_tokenizer, tapo_prompts):
    """Log-probs, entropy and every gradient of the shared-prefix update equal the plain
    forward's on a tiny SmolLM2-like Llama (GQA, tied embedding: its gradient sums both uses)."""
    model = make_llama(vocab=len(tapo_tokenizer), seed=3)
    model.config.pad_token_id = tapo_tokenizer.pad_token_id
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings())
    batch = _batch(policy, tapo_prompts[:3], rows=[0, 0, 0, 1, 1, 2, 2, 2], seed=4)
    shared, _ = _compare(model, tapo_tokenizer, batch, temperature=0.8)
    assert shared["rows"] == [3, 8]  # each prompt once, then every completion


# ------------------------------------------------------------------ LoRA on the fast path
def test_lora_policy_is_sampled_by_lean_with_its_adapters(caplog):
    base = make_llama()
    plain_logits_model = make_llama()  # the same base weights, never wrapped
    model = with_lora(base)
    assert LeanBackend().unsupported_reason(model) is None
    with caplog.at_level(logging.INFO, logger="creditflow.rollout.backends"):
        assert isinstance(rollout_backend({"name": "lean"}, model), LeanBackend)
    assert not [r for r in caplog.records if "does not support" in r.getMessage()]

    ids, mask = left_padded_prompts([6, 3], seed=5)
    completion = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(6))
    expected = hf_logits(model, ids, mask, completion)  # peft's forward
    without = hf_logits(plain_logits_model, ids, mask, completion)
    assert float((expected - without).abs().max()) > 0.5  # the adapters do change the logits
    backend = LeanBackend()
    decoder_model = model.get_base_model()
    actual = lean_logits(decoder_model, ids, mask, 1, completion)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)

    r = request(ids, mask, group_size=3, max_new_tokens=9, temperature=0.9, top_p=0.95)
    torch.manual_seed(3)
    hf = HFBackend().generate(model, r)
    torch.manual_seed(3)
    lean = backend.generate(model, r)
    torch.testing.assert_close(lean.completion_ids, hf.completion_ids, rtol=0, atol=0)


def test_lora_fusing_leaves_the_module_alone_and_follows_its_steps():
    model = with_lora(make_llama())
    before = {name: t.clone() for name, t in model.state_dict().items()}
    backend = LeanBackend()
    ids, mask = left_padded_prompts([5, 4], seed=8)

    def greedy(version: int):
        r = request(
            ids, mask, group_size=1, max_new_tokens=8, do_sample=False, weights_version=version
        )
        return backend.generate(model, r).completion_ids

    first = greedy(0)
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), f"{name} changed"
    assert not any(m.merged for m in model.modules() if isinstance(m, peft.tuners.lora.Linear))

    with torch.no_grad():  # an optimizer step on the adapters only
        for name, parameter in model.named_parameters():
            if "lora_A" in name:
                parameter.add_(torch.randn_like(parameter))
    assert torch.equal(greedy(0), first)  # same weights_version: the cached fused copy
    stepped = greedy(1)
    hf = HFBackend().generate(
        model, request(ids, mask, group_size=1, max_new_tokens=8, do_sample=False)
    )
    assert not torch.equal(stepped, first)
    torch.testing.assert_close(stepped, hf.completion_ids, rtol=0, atol=0)

    # Adapters disabled (the KL reference's view): the base model's tokens, at the same version.
    with model.disable_adapter():
        disabled = greedy(1)
        base = HFBackend().generate(
            model, request(ids, mask, group_size=1, max_new_tokens=8, do_sample=False)
        )
    torch.testing.assert_close(disabled, base.completion_ids, rtol=0, atol=0)
    assert not torch.equal(disabled, stepped)
    assert torch.equal(greedy(1), stepped)  # enabled again: rebuilt with the adapters


def test_lora_on_some_layers_and_a_language_policy(tapo_tokenizer, tapo_prompts):
    """Adapters on q/v only; the policy samples through lean (its sampler log-probs equal the
    scoring forward's) with no fallback to hf."""
    model = with_lora(make_llama(vocab=len(tapo_tokenizer)), target_modules=["q_proj", "v_proj"])
    model.base_model.model.config.pad_token_id = tapo_tokenizer.pad_token_id
    model.generation_config.eos_token_id = tapo_tokenizer.eos_token_id
    backend = rollout_backend({"name": "lean"}, model)
    assert isinstance(backend, LeanBackend)
    policy = LanguagePolicy(
        model,
        tapo_tokenizer,
        SamplingSettings(max_new_tokens=6),
        use_chat_template=False,
        backend=backend,
    )
    torch.manual_seed(0)
    batch = policy.sample(tapo_prompts[:2], group_size=3)
    keep = batch.completion_mask.bool()
    torch.testing.assert_close(batch.sampler_logp[keep], batch.old_logp[keep], atol=1e-4, rtol=1e-4)


def test_dora_is_refused_and_the_fallback_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(backends_module, "_logged_fallbacks", set())
    model = with_lora(make_llama(), use_dora=True)
    reason = LeanBackend().unsupported_reason(model)
    assert reason is not None and "DoRA" in reason
    with caplog.at_level(logging.INFO, logger="creditflow.rollout.backends"):
        for _ in range(3):
            assert isinstance(rollout_backend({"name": "lean"}, model), HFBackend)
    lines = [r.getMessage() for r in caplog.records if "does not support" in r.getMessage()]
    assert len(lines) == 1 and "DoRA" in lines[0]
