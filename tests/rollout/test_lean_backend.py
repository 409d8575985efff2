"""The ``lean`` rollout backend against transformers: every decode step's logits, the
greedy and seeded tokens of ``HFBackend``, the sampler's distribution and log-probs, the group
layout, what it refuses, and its weights cache.

The models are random ``Qwen2ForCausalLM``s from real ``Qwen2Config``s (GQA and plain
multi-head, tied and untied heads, head sizes 6 to 14, RoPE theta 1e4 / 1e6, linear RoPE
scaling, eager and sdpa attention), initialised with std 0.3 so the logits spread over several
units (at transformers' 0.02 every token is almost equally likely and a temperature barely
changes the distribution).
"""

import dataclasses
import math

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LogitsProcessorList,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.generation.logits_process import (
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from creditflow.rollout.backends import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationRequest,
    completion_mask_from_eos,
    rollout_backend,
)
from creditflow.rollout.backends.hf import HFBackend
from creditflow.rollout.backends.lean import LeanBackend, LeanDecoder, Sampler

V = 101  # vocabulary
PAD = 0

CONFIGS = {
    # GQA 3:1, head size 14, odd MLP size, untied head
    "gqa3_untied": dict(
        hidden_size=42,
        num_attention_heads=3,
        num_key_value_heads=1,
        intermediate_size=77,
        num_hidden_layers=2,
        tie_word_embeddings=False,
    ),
    # GQA 3:1 with two KV heads, Qwen2.5's RoPE theta and norm eps, tied head, sdpa
    "gqa_tied_qwen25": dict(
        hidden_size=48,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=64,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        rms_norm_eps=1e-5,
        attn_implementation="sdpa",
    ),
    # plain multi-head attention, head size 6, linear RoPE scaling, one layer
    "mha_linear_rope": dict(
        hidden_size=30,
        num_attention_heads=5,
        num_key_value_heads=5,
        intermediate_size=50,
        num_hidden_layers=1,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
    ),
}


def make_qwen2(name: str = "gqa3_untied", seed: int = 0, **overrides) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=V,
        max_position_embeddings=128,
        initializer_range=0.3,
        pad_token_id=PAD,
        **{"attn_implementation": "eager", **CONFIGS[name], **overrides},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval()


def left_padded_prompts(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, P) random ids (never PAD) and mask, left-padded to the longest length."""
    generator = torch.Generator().manual_seed(seed)
    P = max(lengths)
    ids = torch.randint(1, V, (len(lengths), P), generator=generator)
    mask = torch.zeros(len(lengths), P, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, P - length :] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def request(ids, mask, **options) -> GenerationRequest:
    return GenerationRequest(prompt_ids=ids, prompt_mask=mask, pad_id=PAD, **options)


def hf_logits(model, prompt_ids, prompt_mask, completion_ids) -> torch.Tensor:
    """(B, T, V) float32 logits HF's forward gives for every completion token, on the full
    sequences with generate()'s position ids (real tokens counted only)."""
    T = completion_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits
    P = prompt_ids.shape[1]
    return logits[:, P - 1 : P + T - 1].float()  # (B, T, V)


def lean_logits(model, prompt_ids, prompt_mask, group_size, completion_ids) -> torch.Tensor:
    """(B, T, V) logits of the lean decoder fed ``completion_ids`` one step at a time."""
    T = completion_ids.shape[1]
    decoder = LeanDecoder(
        model,
        LeanBackend().fused_weights(model, version=0),
        prompt_ids,
        prompt_mask,
        group_size,
        max_new_tokens=T,
    )
    steps = [decoder.prefill()]
    steps += [decoder.step(completion_ids[:, t]) for t in range(T - 1)]
    return torch.stack(steps, dim=1)  # (B, T, V)


def hf_processors(r: GenerationRequest) -> LogitsProcessorList:
    """The processors generate() builds for the options HFBackend passes."""
    processors = LogitsProcessorList()
    if r.suppressed_ids:
        processors.append(SuppressTokensLogitsProcessor(list(r.suppressed_ids)))
    if r.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(r.temperature))
    if r.top_k:
        processors.append(TopKLogitsWarper(r.top_k))
    if r.top_p < 1.0:
        processors.append(TopPLogitsWarper(r.top_p))
    return processors


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


# ------------------------------------------------------------------ (1) logits of every step
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_step_logits_match_hf_forward(name):
    model = make_qwen2(name)
    ids, mask = left_padded_prompts([7, 3, 5])  # N = 3
    G, T = 2, 9
    completion = torch.randint(1, V, (3 * G, T), generator=torch.Generator().manual_seed(1))
    expected = hf_logits(
        model, ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0), completion
    )
    actual = lean_logits(model, ids, mask, G, completion)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_attention_implementation_is_the_modules():
    """Eager and sdpa transformers models both match: the loop runs the module's own."""
    ids, mask = left_padded_prompts([4, 6])
    completion = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(2))
    for attn in ("eager", "sdpa"):
        model = make_qwen2(attn_implementation=attn)
        torch.testing.assert_close(
            lean_logits(model, ids, mask, 1, completion),
            hf_logits(model, ids, mask, completion),
            atol=1e-5,
            rtol=1e-5,
        )


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_ambient_bf16_autocast_is_respected(attn):
    """Under the trainer's bf16 autocast the loop casts what HF's forward casts: its logits
    are HF's autocast logits, which are ~0.1 away from the float32 ones."""
    model = make_qwen2(attn_implementation=attn)
    ids, mask = left_padded_prompts([4, 6])
    completion = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(2))
    float32 = hf_logits(model, ids, mask, completion)
    backend = LeanBackend()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = hf_logits(model, ids, mask, completion)
        actual = lean_logits(model, ids, mask, 1, completion)
        assert backend.fused_weights(model, 0).dtype == torch.bfloat16
    assert backend.fused_weights(model, 0).dtype == torch.float32  # a new entry outside it
    assert float((expected - float32).abs().max()) > 0.05  # autocast does change the logits
    if attn == "eager":
        torch.testing.assert_close(actual, expected, atol=1e-2, rtol=0)
    else:
        # sdpa may pick another bf16 kernel for the loop's static-cache shapes than for HF's
        # forward (which one depends on the CPU); their roundings then differ by a few bf16
        # ulps of the logits (seen on an AMD EPYC: 2 ulps, 0.0625 at |logit| ~6).
        ulp = 2.0 ** (math.floor(math.log2(float(expected.abs().max()))) - 7)
        torch.testing.assert_close(actual, expected, atol=4 * ulp, rtol=0)
    # Whatever the kernel, the loop's logits are bf16's, not float32's.
    assert (actual - expected).abs().max() < (actual - float32).abs().max() / 2


def test_bf16_module_runs_in_bf16():
    model = make_qwen2().to(torch.bfloat16)
    ids, mask = left_padded_prompts([4, 6])
    completion = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(
        lean_logits(model, ids, mask, 1, completion),
        hf_logits(model, ids, mask, completion),
        atol=1e-2,
        rtol=0,
    )


# ------------------------------------------------------------------ (2) greedy tokens
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_tokens_match_hf_backend(name):
    model = make_qwen2(name)
    ids, mask = left_padded_prompts([6, 2, 4, 5], seed=3)
    free = HFBackend().generate(
        model, request(ids, mask, group_size=2, max_new_tokens=12, do_sample=False)
    )
    # Stop on a token row 0 says from step 2 on and row 2 (prompt 1) never says: row 0 stops
    # early, row 2 runs to max_new_tokens.
    row0, row2 = free.completion_ids[0].tolist(), free.completion_ids[2].tolist()
    stops = (next(token for token in row0[2:] if token not in row2),)
    greedy = request(ids, mask, group_size=2, max_new_tokens=12, do_sample=False, stop_ids=stops)
    expected = HFBackend().generate(model, greedy)
    actual = LeanBackend().generate(model, greedy)
    torch.testing.assert_close(actual.completion_ids, expected.completion_ids, rtol=0, atol=0)
    assert actual.finish_reasons == expected.finish_reasons
    assert {FINISH_STOP, FINISH_LENGTH} <= set(actual.finish_reasons)
    # pad_id after the stop id, which is kept
    keep = completion_mask_from_eos(actual.completion_ids, list(stops)).bool()
    assert (actual.completion_ids[~keep] == PAD).all()
    assert (actual.sampler_logp[~keep] == 0).all()


def test_greedy_without_stop_ids_runs_max_new_tokens():
    model = make_qwen2()
    ids, mask = left_padded_prompts([3, 5])
    greedy = request(ids, mask, group_size=2, max_new_tokens=7, do_sample=False)
    actual = LeanBackend().generate(model, greedy)
    expected = HFBackend().generate(model, greedy)
    assert actual.completion_ids.shape == (4, 7)
    torch.testing.assert_close(actual.completion_ids, expected.completion_ids, rtol=0, atol=0)
    assert actual.finish_reasons == [FINISH_LENGTH] * 4


def test_loop_ends_when_every_row_has_stopped():
    model = make_qwen2()
    ids, mask = left_padded_prompts([3, 5])
    free = LeanBackend().generate(
        model, request(ids, mask, group_size=1, max_new_tokens=10, do_sample=False)
    )
    stops = (free.completion_ids[0, 1].item(), free.completion_ids[1, 2].item())
    greedy = request(ids, mask, group_size=1, max_new_tokens=10, do_sample=False, stop_ids=stops)
    actual = LeanBackend().generate(model, greedy)
    expected = HFBackend().generate(model, greedy)
    assert actual.completion_ids.shape[1] <= 3
    torch.testing.assert_close(actual.completion_ids, expected.completion_ids, rtol=0, atol=0)


# ------------------------------------------------------------------ (3) sampling semantics
def test_top_p_keeps_the_tokens_above_the_dropped_tail():
    """Four equal logits: probabilities 1/4 each (exact in float32), ascending cumulative mass
    1/4, 1/2, 3/4, 1; top_p = 0.5 drops the tail of mass <= 1 - 0.5, i.e. two tokens."""
    ids, mask = left_padded_prompts([2])
    r = request(ids, mask, group_size=1, max_new_tokens=1, top_p=0.5)
    scores = Sampler(r, 4, torch.device("cpu")).scores(torch.zeros(1, 4))
    assert int(torch.isfinite(scores).sum()) == 2


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.6), (0.9, 8, 0.75), (1.0, 1, 1.0)],
)
def test_sampler_scores_are_transformers_processors(temperature, top_k, top_p):
    """Bit for bit what generate()'s processors give, ties included (logits in steps of 0.5)."""
    ids, mask = left_padded_prompts([2])
    logits = (torch.randn(16, 50, generator=torch.Generator().manual_seed(9)) * 4).round() / 2
    r = request(
        ids,
        mask,
        group_size=16,
        max_new_tokens=1,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        suppressed_ids=(3, 7),
    )
    expected = hf_processors(r)(None, logits.clone())
    actual = Sampler(r, 50, torch.device("cpu")).scores(logits)
    assert torch.equal(actual, expected)
    greedy = dataclasses.replace(r, do_sample=False)  # greedy: suppression only
    expected = SuppressTokensLogitsProcessor([3, 7])(None, logits.clone())
    assert torch.equal(Sampler(greedy, 50, torch.device("cpu")).scores(logits), expected)


def test_suppressed_ids_never_appear():
    model = make_qwen2()
    ids, mask = left_padded_prompts([4, 6, 3])
    # The ids greedy decoding picks most: sampled often unless suppressed.
    greedy = LeanBackend().generate(
        model, request(ids, mask, group_size=1, max_new_tokens=8, do_sample=False)
    )
    suppressed = tuple(
        torch.bincount(greedy.completion_ids.flatten(), minlength=V).topk(3).indices.tolist()
    )
    sample = dict(group_size=16, max_new_tokens=8, temperature=0.7)
    torch.manual_seed(0)
    free = LeanBackend().generate(model, request(ids, mask, **sample))
    assert torch.isin(free.completion_ids, torch.tensor(suppressed)).any()
    torch.manual_seed(0)
    kept_out = LeanBackend().generate(
        model, request(ids, mask, suppressed_ids=suppressed, **sample)
    )
    assert not torch.isin(kept_out.completion_ids, torch.tensor(suppressed)).any()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_top_k_one_and_tiny_top_p_are_greedy(name):
    model = make_qwen2(name)
    ids, mask = left_padded_prompts([5, 2, 6])
    options = dict(group_size=3, max_new_tokens=8, suppressed_ids=(7,))
    greedy = LeanBackend().generate(model, request(ids, mask, do_sample=False, **options))
    for sampler in ({"top_k": 1, "temperature": 1.5}, {"top_p": 1e-6, "temperature": 0.6}):
        torch.manual_seed(0)
        sampled = LeanBackend().generate(model, request(ids, mask, **sampler, **options))
        torch.testing.assert_close(sampled.completion_ids, greedy.completion_ids, rtol=0, atol=0)
        # One token left: it has probability 1 under the sampling distribution.
        torch.testing.assert_close(sampled.sampler_logp, torch.zeros_like(sampled.sampler_logp))


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "wrong_temperature"),
    [(0.7, 0, 1.0, 1.0), (1.4, 12, 1.0, 1.0), (1.0, 0, 0.8, 0.7), (0.8, 20, 0.9, 1.0)],
)
def test_first_token_distribution_is_the_filtered_softmax(
    temperature, top_k, top_p, wrong_temperature
):
    """20,000 rows of one prompt: the histogram of their first token is within 0.03 (total
    variation) of softmax(logits / temperature) filtered by top-k / top-p, built with
    transformers' own warpers; the same filter at another temperature is over 0.09 away."""
    model = make_qwen2(seed=4)
    ids, mask = left_padded_prompts([6], seed=5)
    G = 20_000
    sampling = request(
        ids, mask, group_size=G, max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p
    )
    torch.manual_seed(0)
    tokens = LeanBackend().generate(model, sampling).completion_ids[:, 0]  # (G,)
    empirical = torch.bincount(tokens, minlength=V).float() / G  # (V,)

    logits = hf_logits(model, ids, mask, torch.zeros(1, 1, dtype=torch.long))[:, 0]  # (1, V)

    def filtered(r: GenerationRequest) -> torch.Tensor:
        return hf_processors(r)(None, logits.clone()).softmax(dim=-1)[0]  # (V,)

    expected = filtered(sampling)
    wrong = filtered(
        request(
            ids,
            mask,
            group_size=G,
            max_new_tokens=1,
            temperature=wrong_temperature,
            top_k=top_k,
            top_p=top_p,
        )
    )
    assert (empirical[expected == 0] == 0).all()  # nothing outside the top-k / top-p set
    # Sampling noise: E[TV] <= 0.5 * sqrt(2 K / (pi G)) ~ 0.028 for all K = 101 ids alive.
    assert total_variation(empirical, expected) < 0.03
    assert total_variation(expected, wrong) > 0.09


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sampler_logp_matches_slow_reference(name):
    """A plain loop: HF's forward on the whole sequence so far, HF's processors, log-softmax
    at the token the lean loop drew."""
    model = make_qwen2(name)
    ids, mask = left_padded_prompts([5, 3], seed=6)
    stops = (11, 23, 42)
    r = request(
        ids,
        mask,
        group_size=3,
        max_new_tokens=10,
        temperature=0.8,
        top_k=30,
        top_p=0.9,
        stop_ids=stops,
        suppressed_ids=(5,),
    )
    torch.manual_seed(1)
    generation = LeanBackend().generate(model, r)
    completion = generation.completion_ids  # (B, T)
    B, T = completion.shape
    prompt_ids, prompt_mask = ids.repeat_interleave(3, dim=0), mask.repeat_interleave(3, dim=0)
    processors = hf_processors(r)
    expected = torch.zeros(B, T)
    for t in range(T):
        logits = hf_logits(model, prompt_ids, prompt_mask, completion[:, : t + 1])[:, t]  # (B, V)
        logp = processors(None, logits).log_softmax(dim=-1)
        expected[:, t] = logp.gather(1, completion[:, t : t + 1]).squeeze(1)
    keep = completion_mask_from_eos(completion, list(stops)).bool()
    expected = expected.masked_fill(~keep, 0.0)
    assert torch.isfinite(expected).all()  # every drawn token was in the filtered support
    torch.testing.assert_close(generation.sampler_logp, expected, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_seeded_sample_replays_hf_random_stream(name):
    """One multinomial draw on the (B, V) probabilities per step, as generate() makes, so a
    seeded lean sample is the seeded hf sample (here: no float difference flips a token)."""
    model = make_qwen2(name)
    ids, mask = left_padded_prompts([6, 2, 4], seed=7)
    r = request(
        ids,
        mask,
        group_size=4,
        max_new_tokens=10,
        temperature=0.9,
        top_k=40,
        top_p=0.95,
        stop_ids=(3, 9),
    )
    torch.manual_seed(2)
    expected = HFBackend().generate(model, r)
    torch.manual_seed(2)
    actual = LeanBackend().generate(model, r)
    torch.testing.assert_close(actual.completion_ids, expected.completion_ids, rtol=0, atol=0)
    assert actual.finish_reasons == expected.finish_reasons


# ------------------------------------------------------------------ (4) group layout
def test_rows_of_a_group_answer_their_prompt():
    model = make_qwen2()
    lengths = [5, 2, 7]
    ids, mask = left_padded_prompts(lengths, seed=8)
    G, T = 3, 6
    actual = LeanBackend().generate(
        model, request(ids, mask, group_size=G, max_new_tokens=T, do_sample=False)
    )
    alone = []
    for n, length in enumerate(lengths):
        one = request(
            ids[n : n + 1, -length:],
            mask[n : n + 1, -length:],
            group_size=1,
            max_new_tokens=T,
            do_sample=False,
        )
        alone.append(HFBackend().generate(model, one).completion_ids[0])
    assert len({tuple(row.tolist()) for row in alone}) == len(lengths)  # distinct answers
    for n, expected in enumerate(alone):
        for row in range(n * G, n * G + G):
            torch.testing.assert_close(actual.completion_ids[row], expected, rtol=0, atol=0)


# ------------------------------------------------------------------ (5) what it refuses
def tiny_gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=1, n_head=2)).eval()


class AdapterLinear(torch.nn.Linear):
    """Stands in for a LoRA or quantised layer: a Linear whose forward is not the plain one."""


def with_adapter() -> Qwen2ForCausalLM:
    model = make_qwen2()
    q_proj = model.model.layers[0].self_attn.q_proj
    adapter = AdapterLinear(q_proj.in_features, q_proj.out_features)
    adapter.load_state_dict(q_proj.state_dict())
    model.model.layers[0].self_attn.q_proj = adapter
    return model


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (tiny_gpt2, "GPT2LMHeadModel"),
        (lambda: make_qwen2(use_sliding_window=True, sliding_window=4), "sliding"),
        (
            lambda: make_qwen2(
                rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
            ),
            "dynamic",
        ),
        (lambda: make_qwen2(hidden_act="gelu"), "gelu"),
        (with_adapter, "AdapterLinear"),
    ],
)
def test_unsupported_models_are_refused(build, words):
    model = build()
    backend = LeanBackend()
    reason = backend.unsupported_reason(model)
    assert reason is not None and words in reason
    ids, mask = left_padded_prompts([3])
    with pytest.raises(ValueError, match="lean"):
        backend.generate(model, request(ids, mask, group_size=1, max_new_tokens=2))
    # chosen by name, the registry falls back to hf for it
    assert isinstance(rollout_backend({"name": "lean"}, model), HFBackend)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_qwen2_text_models_are_supported(name):
    model = make_qwen2(name)
    assert LeanBackend().unsupported_reason(model) is None
    assert isinstance(rollout_backend({"name": "lean"}, model), LeanBackend)


def test_right_padded_prompts_are_refused():
    ids, mask = left_padded_prompts([3, 5])
    with pytest.raises(ValueError, match="left-padded"):
        LeanBackend().generate(
            make_qwen2(), request(ids.flip(1), mask.flip(1), group_size=1, max_new_tokens=2)
        )


# ------------------------------------------------------------------ (6) weights cache
def test_fused_weights_are_rebuilt_per_weights_version():
    model = make_qwen2()
    ids, mask = left_padded_prompts([4, 6])
    backend = LeanBackend()

    def greedy(version: int):
        r = request(
            ids, mask, group_size=2, max_new_tokens=8, do_sample=False, weights_version=version
        )
        return backend.generate(model, r)

    before = greedy(0)
    fused = backend.fused
    assert backend.fused_weights(model, 0) is fused and fused.version == 0
    old_gate_up = fused.layers[0].gate_up_weight.clone()
    with torch.no_grad():  # an "optimizer step"
        for layer in model.model.layers:
            layer.mlp.up_proj.weight.mul_(-3.0)
            layer.self_attn.q_proj.weight.add_(0.5)

    stale = greedy(0)  # same version: the cached copy, not rebuilt
    assert backend.fused is fused
    torch.testing.assert_close(fused.layers[0].gate_up_weight, old_gate_up, rtol=0, atol=0)
    assert stale.weights_version == 0

    after = greedy(1)
    after_fused = backend.fused
    assert after_fused is not fused and after_fused.version == 1
    assert after.weights_version == 1
    assert not torch.equal(after.completion_ids, before.completion_ids)
    expected = HFBackend().generate(
        model, request(ids, mask, group_size=2, max_new_tokens=8, do_sample=False)
    )
    torch.testing.assert_close(after.completion_ids, expected.completion_ids, rtol=0, atol=0)

    other = make_qwen2(seed=1)  # another module at the same version: its own weights
    fused_other = backend.fused_weights(other, 1)
    assert fused_other is not after_fused and fused_other.module() is other
