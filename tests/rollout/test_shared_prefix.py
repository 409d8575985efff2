"""The shared-prefix scoring forward against the plain one.

Each case scores one batch twice with the same tiny Qwen2 (GQA, float32, training mode): once
with ``shared_prefix`` (each run of identical prompts runs once, its KV cache expanded to the
run's rows) and once over ``[prompt, completion]`` for every row. Log-probs, entropies and every
parameter's gradient must agree to float rounding, and a hook on the decoder counts the rows of
each forward, so a silent fallback to the plain path fails the test.
"""

import dataclasses

import pytest
import torch

from creditflow.rollout import LanguagePolicy, RolloutBatch, SamplingSettings
from creditflow.rollout.shared_prefix import prompt_runs, shared_prefix_hidden, why_not_shared
from tests.training.helpers import make_trainer

T_MAX = 7


def _batch(policy: LanguagePolicy, prompts: list[str], rows: list[int], seed: int) -> RolloutBatch:
    """Row b answers ``prompts[rows[b]]`` with random tokens, right-padded to random lengths
    (row 0 has all T_MAX tokens, row 1 one)."""
    ids, mask = policy.encode_prompts(prompts)  # (N, P), left-padded
    index = torch.tensor(rows)
    B = len(rows)
    g = torch.Generator().manual_seed(seed)
    completion_ids = torch.randint(len(policy.tokenizer), (B, T_MAX), generator=g)
    lengths = torch.randint(1, T_MAX + 1, (B,), generator=g)
    lengths[:2] = torch.tensor([T_MAX, 1])
    completion_mask = (torch.arange(T_MAX) < lengths.unsqueeze(1)).float()  # (B, T)
    return RolloutBatch(
        prompt_ids=ids[index],
        prompt_mask=mask[index],
        completion_ids=completion_ids.masked_fill(
            completion_mask == 0, policy.tokenizer.pad_token_id
        ),
        completion_mask=completion_mask,
        old_logp=torch.empty(0),
        completion_texts=[""] * B,
        prompt_index=index,
        group_size=1,
    )


def _score(model, tokenizer, batch: RolloutBatch, **sampling) -> dict:
    """Log-probs, entropy, the gradient of a fixed weighted sum of the log-probs, and the row
    count of every decoder forward."""
    policy = LanguagePolicy(model, tokenizer, SamplingSettings(**sampling))
    rows: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    model.zero_grad(set_to_none=True)
    try:
        logp, entropy = policy.completion_logprobs(batch, with_entropy=True)
    finally:
        hook.remove()
    g = torch.Generator().manual_seed(1)
    weights = torch.randn(logp.shape, generator=g) * batch.completion_mask  # (B, T)
    (logp * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {"logp": logp.detach(), "entropy": entropy, "grads": grads, "rows": rows}


def _assert_same(shared: dict, plain: dict) -> None:
    torch.testing.assert_close(shared["logp"], plain["logp"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(shared["entropy"], plain["entropy"], rtol=1e-6, atol=1e-6)
    assert shared["grads"].keys() == plain["grads"].keys()
    for name, grad in plain["grads"].items():
        error = (shared["grads"][name] - grad).norm() / grad.norm().clamp(min=1e-12)
        assert error < 1e-5, f"{name}: relative gradient error {error:.2e}"


def _compare(model, tokenizer, batch: RolloutBatch, **sampling) -> tuple[dict, dict]:
    model.train()
    shared = _score(model, tokenizer, batch, shared_prefix=True, **sampling)
    plain = _score(model, tokenizer, batch, shared_prefix=False, **sampling)
    _assert_same(shared, plain)
    assert plain["rows"] == [batch.batch_size]
    return shared, plain


def test_prompt_runs_splits_rows_into_runs_of_identical_prompts():
    # Rows 0-1 equal; row 2 has other ids; row 3 has row 0's ids but another mask.
    ids = torch.tensor([[5, 6], [5, 6], [7, 6], [5, 6], [5, 6]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 1], [1, 1]])
    assert prompt_runs(ids, mask).tolist() == [2, 1, 1, 1]
    assert prompt_runs(ids[:1], mask[:1]).tolist() == [1]


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_whole_groups_equal_the_plain_forward(
    make_model, tapo_tokenizer, tapo_prompts, attn_implementation
):
    model = make_model(attn_implementation=attn_implementation)
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings())
    batch = _batch(policy, tapo_prompts[:3], [0] * 4 + [1] * 4 + [2] * 4, seed=0)
    shared, _ = _compare(model, tapo_tokenizer, batch)
    assert shared["rows"] == [3, 12], "3 prompts once, then the 12 completions"


def test_a_shuffled_batch_with_mixed_run_lengths(make_model, tapo_tokenizer, tapo_prompts):
    """Runs 3, 1, 2, 1, 3, 1, 1 (prompt 0 in three runs): each run's prompt runs once."""
    model = make_model(seed=1)
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings())
    rows = [0, 0, 0, 1, 2, 2, 0, 1, 1, 1, 2, 0]
    batch = _batch(policy, tapo_prompts[:3], rows, seed=1)
    shared, _ = _compare(model, tapo_tokenizer, batch)
    assert shared["rows"] == [7, 12]


def test_left_padded_prompts_of_different_lengths(make_model, tapo_tokenizer, tapo_prompts):
    model = make_model(seed=2)
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings())
    prompts = ["Add 2 and 3.", tapo_prompts[0], "Hi"]
    batch = _batch(policy, prompts, [0] * 3 + [1] * 3 + [2] * 3, seed=2)
    lengths = batch.prompt_mask.sum(dim=1).unique()
    assert len(lengths) == 3 and (batch.prompt_mask[:, 0] == 0).any(), "really left-padded"
    shared, _ = _compare(model, tapo_tokenizer, batch)
    assert shared["rows"] == [3, 9]


def test_small_logprob_chunks(make_model, tapo_tokenizer, tapo_prompts):
    model = make_model(seed=3)
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings())
    batch = _batch(policy, tapo_prompts[:2], [0] * 4 + [1] * 4, seed=3)
    shared, _ = _compare(model, tapo_tokenizer, batch, logprob_chunk_size=3, temperature=0.7)
    assert shared["rows"] == [2, 8]


def test_a_single_completion_token_needs_only_the_prompt_pass(
    make_model, tapo_tokenizer, tapo_prompts
):
    model = make_model(seed=4)
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings())
    full = _batch(policy, tapo_prompts[:2], [0] * 3 + [1] * 3, seed=4)
    batch = dataclasses.replace(
        full, completion_ids=full.completion_ids[:, :1], completion_mask=full.completion_mask[:, :1]
    )
    shared, _ = _compare(model, tapo_tokenizer, batch)
    assert shared["rows"] == [2]


def test_gradient_checkpointing_falls_back_to_the_plain_forward(
    make_model, tapo_tokenizer, tapo_prompts
):
    """transformers drops the KV cache in a checkpointed training forward, so the update takes
    the plain path; a no-grad forward (the rollout's old_logp) keeps the cache and shares."""
    model = make_model(seed=5)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings())
    batch = _batch(policy, tapo_prompts[:2], [0] * 4 + [1] * 4, seed=5)
    assert why_not_shared(model.train()) is not None
    shared, _ = _compare(model, tapo_tokenizer, batch)
    assert shared["rows"] == [8], "the plain forward"
    rows: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    with torch.no_grad():
        logp, _ = policy.completion_logprobs(batch)
    hook.remove()
    assert rows == [2, 8]
    torch.testing.assert_close(logp, shared["logp"], rtol=1e-6, atol=1e-6)


def test_distinct_prompts_or_extras_take_the_plain_forward(
    make_model, tapo_tokenizer, tapo_prompts
):
    model = make_model(seed=6)
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings())
    rows: list[int] = []
    model.model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    distinct = _batch(policy, tapo_prompts[:4], [0, 1, 2, 3], seed=6)
    args = (distinct.prompt_ids, distinct.prompt_mask, distinct.completion_ids)
    with torch.no_grad():
        shared_prefix_hidden(model, *args, distinct.completion_mask)
        grouped = _batch(policy, tapo_prompts[:2], [0, 0, 1, 1], seed=6)
        token_type_ids = torch.zeros(4, grouped.prompt_ids.shape[1] + T_MAX, dtype=torch.long)
        shared_prefix_hidden(
            model,
            grouped.prompt_ids,
            grouped.prompt_mask,
            grouped.completion_ids,
            grouped.completion_mask,
            token_type_ids=token_type_ids,
        )
    assert rows == [4, 4]


def _update_rows(trainer, monkeypatch) -> list[list[int]]:
    """The rows of every minibatch of one GRPO step (``update`` cuts them with ``select``)."""
    seen, select = [], RolloutBatch.select

    def recording(batch, rows):
        seen.append(rows.tolist())
        return select(batch, rows)

    monkeypatch.setattr(RolloutBatch, "select", recording)
    trainer.step(0)
    return seen


@pytest.mark.parametrize(
    ("group_size", "minibatch_size", "whole_groups"), [(2, 4, True), (4, 2, False)]
)
def test_update_keeps_groups_whole_and_visits_every_row_once(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch, group_size, minibatch_size, whole_groups
):
    """B = 8, two iterations: every iteration visits each row once; a minibatch that is a
    multiple of G holds whole groups, rows of a group consecutive and in order (the shared
    prefix's runs); otherwise rows are shuffled one by one."""
    G = group_size
    trainer = make_trainer(
        make_model(),
        tapo_tokenizer,
        tapo_prompts,
        prompts_per_step=8 // G,
        group_size=G,
        minibatch_size=minibatch_size,
        num_iterations=2,
    )
    minibatches = _update_rows(trainer, monkeypatch)
    per_iteration = 8 // minibatch_size
    assert [len(rows) for rows in minibatches] == [minibatch_size] * 2 * per_iteration
    for i in (0, per_iteration):
        assert sorted(sum(minibatches[i : i + per_iteration], [])) == list(range(8))
    order = sum(minibatches, [])
    runs = [order[j : j + G] for j in range(0, 16, G)]
    assert all(run == list(range(run[0], run[0] + G)) for run in runs) == whole_groups
    if whole_groups:
        assert all(run[0] % G == 0 for run in runs)
