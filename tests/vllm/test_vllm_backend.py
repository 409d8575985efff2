"""The ``vllm`` rollout backend for real, on CPU (docs/vllm.md): one colocated
``vllm.LLM`` for the module, a vLLM OpenAI server started by the test for the server mode.

Run with ``make test-vllm`` (the vLLM environment, .venv-vllm). In .venv, without vLLM, only
the checks that need no engine run and the rest skip (``pytest.importorskip("vllm")``).

The models are tiny ``Qwen2ForCausalLM``s built from real ``Qwen2Config``s over the TAPO BPE
tokenizer, sized to vLLM's CPU attention (head size 32: it has no kernel below that), with a
tied head for the colocated engine (Qwen2.5's small checkpoints tie theirs; vLLM's in-place
reload then needs the head's name in the weights it is sent) and an untied one on the server. Weights are drawn with std 0.3 so the logits spread over several units (at
transformers' 0.02 every token is almost equally likely and greedy decoding sits on ties).
Shape symbols: N prompts, G completions per prompt, B = N * G rows, T completion tokens.
"""

import importlib.util
import os
import socket
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from creditflow.chain.reranker.model import PointerReranker, RerankerConfig
from creditflow.errors import ConfigError
from creditflow.models import build_tiny_qwen2
from creditflow.rollout import LanguagePolicy, SamplingSettings
from creditflow.rollout.backends import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationRequest,
    completion_mask_from_eos,
    rollout_backend,
)
from creditflow.rollout.backends.hf import HFBackend
from creditflow.rollout.backends.vllm import VLLMBackend

pytestmark = pytest.mark.slow

HAS_VLLM = importlib.util.find_spec("vllm") is not None
# Head size 32 = 64 / 2: the smallest vLLM's CPU attention kernel has.
VLLM_QWEN2 = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 96,
    "max_position_embeddings": 512,
}
KV_CACHE_BYTES = 64 * 2**20  # ~130k tokens of this model's KV cache: plenty, and cheap
LOGP_ATOL = 1e-3  # float32 engine vs float32 trainer forward


def spread(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Redraw every matrix with std 0.3 (norm weights stay 1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def make_qwen2(tapo_tokenizer):
    def make(seed: int = 0, tie_word_embeddings: bool = True):
        model = build_tiny_qwen2(
            tapo_tokenizer, **VLLM_QWEN2, seed=seed, tie_word_embeddings=tie_word_embeddings
        )
        return spread(model, seed)

    return make


@pytest.fixture(scope="module")
def backend(make_qwen2):
    """One colocated engine for the module's tests; each test pushes its own model into it."""
    pytest.importorskip("vllm")
    engine = VLLMBackend(
        "colocate", max_model_len=512, kv_cache_memory_bytes=KV_CACHE_BYTES, enforce_eager=True
    )
    engine.load_weights(make_qwen2(), version=0)  # builds the engine
    yield engine
    engine.close()


def prompts(tapo_tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, P) left-padded ids and mask."""
    tapo_tokenizer.padding_side = "left"
    enc = tapo_tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


def request(tokenizer, texts, *, version: int, **options) -> GenerationRequest:
    ids, mask = prompts(tokenizer, texts)
    defaults = {"group_size": 4, "max_new_tokens": 16, "pad_id": tokenizer.pad_token_id}
    return GenerationRequest(
        prompt_ids=ids, prompt_mask=mask, weights_version=version, **{**defaults, **options}
    )


def trainer_logprobs(model, r: GenerationRequest, completion_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) log-probs of ``completion_ids`` under ``model``'s own forward at the request's
    temperature, each row scored after prompt ``row // G`` (positions count real tokens, as
    in ``generate``)."""
    G = r.group_size
    prompt_ids = r.prompt_ids.repeat_interleave(G, dim=0)  # (B, P)
    prompt_mask = r.prompt_mask.repeat_interleave(G, dim=0)  # (B, P)
    completion_mask = completion_mask_from_eos(completion_ids, list(r.stop_ids)).long()
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P+T)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (B, P+T)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    logits = logits[:, P - 1 : P - 1 + T].float() / r.temperature  # (B, T, V)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1))
    return logp.squeeze(-1) * completion_mask  # (B, T)


# -- no engine needed ---------------------------------------------------------------------


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_backend_says_how_to_get_it():
    with pytest.raises(ImportError, match="make install-vllm"):
        VLLMBackend()


def test_options_are_checked_before_anything_is_built():
    with pytest.raises(ConfigError, match="unknown vllm rollout mode 'colocated'"):
        VLLMBackend("colocated")
    with pytest.raises(ConfigError, match="unknown vllm weight_sync 'ipc'"):
        VLLMBackend("server", weight_sync="ipc")
    with pytest.raises(ConfigError, match="enable_sleep_mode is a colocate option"):
        VLLMBackend("server", enable_sleep_mode=True)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        VLLMBackend(gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="unknown rollout backend 'vllm' option"):
        rollout_backend({"name": "vllm", "gpu_memory": 0.5})


# -- colocated engine ----------------------------------------------------------------------


def test_what_vllm_cannot_load_falls_back_to_hf(make_qwen2, tapo_tokenizer, caplog):
    pytest.importorskip("vllm")
    engine = VLLMBackend()  # nothing is built before the first load
    assert engine.unsupported_reason(make_qwen2()) is None
    reranker = PointerReranker(RerankerConfig(n_features=4, d_model=8, n_heads=2, n_layers=1))
    assert "not a transformers model" in engine.unsupported_reason(reranker)
    # The tests' usual tiny Qwen2 (head size 16) has no CPU attention kernel in vLLM 0.32.
    small_heads = build_tiny_qwen2(tapo_tokenizer, hidden_size=32, num_attention_heads=2)
    assert "head size 16" in engine.unsupported_reason(small_heads)
    assert isinstance(rollout_backend({"name": "vllm"}, reranker), HFBackend)


def test_greedy_rows_equal_hf_greedy_for_the_pushed_weights(
    backend, make_qwen2, tapo_tokenizer, tapo_prompts
):
    model = make_qwen2(seed=1)
    backend.load_weights(model, version=1)
    r = request(tapo_tokenizer, tapo_prompts[:3], version=1, do_sample=False, group_size=2)
    got = backend.generate(model, r)
    want = HFBackend().generate(model, r)
    torch.testing.assert_close(got.completion_ids, want.completion_ids, rtol=0, atol=0)
    assert got.finish_reasons == want.finish_reasons
    assert got.weights_version == backend.weights_version == 1


def test_pushed_weights_show_in_the_next_samples(backend, make_qwen2, tapo_tokenizer, tapo_prompts):
    """A tied model whose first token is k: attention and MLP outputs zeroed (the last
    position's hidden state is its token's embedding), every embedding -1 but k's +1, and the
    final norm's weight -1. After a prompt token x != k the head sees h = -norm(-1) = +1, so
    each logit is -64 but k's +64 (p(k) = 1 - 401 e^-128); after k it sees h = -1, so every
    logit but k's is +64 and the next token is uniform over the V - 1 = 401 others."""
    k = 123
    model = make_qwen2(seed=2)
    V = model.config.vocab_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.fill_(-1.0)  # tied: the head too
        model.model.embed_tokens.weight[k] = 1.0
        model.model.norm.weight.fill_(-1.0)
    r = request(tapo_tokenizer, tapo_prompts[:2], version=7, max_new_tokens=8)
    assert (r.prompt_ids[:, -1] != k).all()

    before = backend.generate(make_qwen2(seed=3), r)  # behind the request: reloads first
    assert (before.completion_ids[:, 0] != k).any()
    backend.load_weights(model, version=7)
    after = backend.generate(model, r)
    ids, logp = after.completion_ids, after.sampler_logp  # (B, T)
    assert (ids[:, 0] == k).all() and (ids[:, 1] != k).all()
    torch.testing.assert_close(logp[:, 0], torch.zeros(8), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        logp[:, 1], torch.full((8,), -torch.log(torch.tensor(V - 1.0)).item()), rtol=0, atol=1e-5
    )
    assert after.weights_version == backend.weights_version == 7
    assert "vllm/generate_s" in after.timings


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logp_agrees_with_the_trainer_forward(
    backend, make_qwen2, tapo_tokenizer, tapo_prompts, temperature
):
    """Also the group layout: row b is scored after prompt b // G, so a row answered from
    another prompt would miss by far more than the tolerance."""
    model = make_qwen2(seed=4)
    backend.load_weights(model, version=2)
    torch.manual_seed(0)
    r = request(tapo_tokenizer, tapo_prompts[:3], version=2, temperature=temperature, group_size=4)
    got = backend.generate(model, r)
    B, T = got.completion_ids.shape
    assert B == 3 * 4 and T <= r.max_new_tokens
    want = trainer_logprobs(model, r, got.completion_ids)  # (B, T)
    torch.testing.assert_close(got.sampler_logp, want, rtol=0, atol=LOGP_ATOL)
    # The G rows of a prompt are G draws, not one draw G times.
    for n in range(3):
        group = got.completion_ids[n * 4 : n * 4 + 4]
        assert len({tuple(row.tolist()) for row in group}) > 1


def test_a_stop_id_is_kept_and_padding_follows(backend, make_qwen2, tapo_tokenizer, tapo_prompts):
    model = make_qwen2(seed=5)
    backend.load_weights(model, version=3)
    pad = tapo_tokenizer.pad_token_id
    torch.manual_seed(1)
    free = backend.generate(model, request(tapo_tokenizer, tapo_prompts[:2], version=3))
    # A stop id that row 0 sampled at its 4th token (and not before).
    row = free.completion_ids[0].tolist()
    stop = row[3]
    first = row.index(stop)

    torch.manual_seed(1)  # the same request seed: the same draws up to each stop
    r = request(tapo_tokenizer, tapo_prompts[:2], version=3, stop_ids=(stop,))
    got = backend.generate(model, r)
    ids, logp = got.completion_ids, got.sampler_logp
    assert ids[0, : first + 1].tolist() == row[: first + 1]
    assert (ids[0, first + 1 :] == pad).all() and (logp[0, first + 1 :] == 0).all()
    assert got.finish_reasons[0] == FINISH_STOP
    for b, reason in enumerate(got.finish_reasons):
        hits = (ids[b] == stop).nonzero().flatten().tolist()
        if reason == FINISH_STOP:  # one stop id, then padding only
            assert len(hits) == 1 and (ids[b, hits[0] + 1 :] == pad).all()
        else:
            assert reason == FINISH_LENGTH and not hits
            assert ids.shape[1] == r.max_new_tokens and (logp[b] != 0).all()


def test_seeded_runs_repeat_and_suppressed_ids_are_never_drawn(
    backend, make_qwen2, tapo_tokenizer, tapo_prompts
):
    model = make_qwen2(seed=6)
    backend.load_weights(model, version=4)
    r = request(tapo_tokenizer, tapo_prompts[:2], version=4)
    torch.manual_seed(2)
    first = backend.generate(model, r).completion_ids
    torch.manual_seed(2)
    again = backend.generate(model, r).completion_ids
    torch.manual_seed(3)
    other = backend.generate(model, r).completion_ids
    assert torch.equal(first, again) and not torch.equal(first, other)

    banned = tuple(sorted(set(first.flatten().tolist()))[:20])
    torch.manual_seed(2)
    suppressed = backend.generate(model, replace(r, suppressed_ids=banned))
    assert not torch.isin(suppressed.completion_ids, torch.tensor(banned)).any()


def test_the_language_policy_samples_through_it(backend, make_qwen2, tapo_tokenizer, tapo_prompts):
    """The policy pushes the weights whenever its version moved, and its scoring forward
    agrees with the sampler's log-probs."""
    model = make_qwen2(seed=7)
    sampling = SamplingSettings(max_new_tokens=12, temperature=1.0)
    policy = LanguagePolicy(
        model, tapo_tokenizer, sampling, use_chat_template=False, backend=backend
    )
    batch = policy.sample(tapo_prompts[:2], group_size=3)
    assert backend.weights_version == policy.weights_version == 0
    mask = batch.completion_mask
    torch.testing.assert_close(
        batch.sampler_logp * mask, batch.old_logp * mask, rtol=0, atol=LOGP_ATOL
    )

    with torch.no_grad():
        model.model.norm.weight.mul_(-1.0)  # an "optimizer step"
    policy.weights_updated()
    batch = policy.sample(tapo_prompts[:2], group_size=3)
    assert backend.weights_version == 1
    mask = batch.completion_mask
    torch.testing.assert_close(
        batch.sampler_logp * mask, batch.old_logp * mask, rtol=0, atol=LOGP_ATOL
    )


# -- server mode ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory, make_qwen2, tapo_tokenizer):
    """``python -m vllm.entrypoints.openai.api_server`` on CPU serving an untied tiny Qwen2
    (seed 10), with the dev routes the weight pushes use."""
    pytest.importorskip("vllm")
    folder = tmp_path_factory.mktemp("served")
    make_qwen2(seed=10, tie_word_embeddings=False).save_pretrained(folder)
    tapo_tokenizer.save_pretrained(folder)
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(folder), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
        "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs",
        # vLLM 0.32's CPU worker fails seeded requests whose prefill is chunked.
        "--no-enable-chunked-prefill",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    log = (folder / "server.log").open("w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


def test_server_mode_samples_with_the_weights_it_was_sent(
    server, make_qwen2, tapo_tokenizer, tapo_prompts
):
    remote = VLLMBackend("server", server_url=server, weight_sync="disk", connect_timeout_s=300)
    model = make_qwen2(seed=11, tie_word_embeddings=False)  # not the model the server loaded
    remote.load_weights(model, version=5)  # waits for the server to come up first

    r = request(tapo_tokenizer, tapo_prompts[:3], version=5, do_sample=False, group_size=2)
    greedy = remote.generate(model, r)
    want = HFBackend().generate(model, r)
    torch.testing.assert_close(greedy.completion_ids, want.completion_ids, rtol=0, atol=0)
    assert greedy.weights_version == 5  # as the server reports it (/weight_info)

    torch.manual_seed(0)
    r = request(tapo_tokenizer, tapo_prompts[:3], version=5, temperature=0.8, group_size=4)
    sampled = remote.generate(model, r)
    assert sampled.completion_ids.shape[0] == 12
    want = trainer_logprobs(model, r, sampled.completion_ids)
    torch.testing.assert_close(sampled.sampler_logp, want, rtol=0, atol=LOGP_ATOL)
    torch.manual_seed(0)
    assert torch.equal(remote.generate(model, r).completion_ids, sampled.completion_ids)
    remote.close()
