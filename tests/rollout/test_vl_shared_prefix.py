"""The vision-language policy's shared-prefix scoring against its plain forward.

As for the text policy (tests/rollout/test_shared_prefix.py): one batch of a tiny Qwen2.5-VL
(GQA, float32, training mode) is scored twice, once with ``shared_prefix`` (each run of rows
with one prompt and one image runs that prompt, its image and its 3-D rope positions once)
and once over ``[prompt, completion]`` for every row. Log-probs, entropies, the no-image
log-probs and every parameter's gradient must agree to float rounding, and a hook on the
language model counts the rows of each forward, so a silent fallback to the plain path fails.
"""

import dataclasses

import pytest
import torch
from PIL import Image, ImageDraw

from creditflow.rollout import RolloutBatch, SamplingSettings, VisionLanguagePolicy
from creditflow.rollout.vision_policy import sequence_rope_positions

T_MAX = 6


def _picture(colour: str) -> Image.Image:
    image = Image.new("RGB", (112, 112), "white")
    ImageDraw.Draw(image).ellipse((10, 10, 90, 90), fill=colour)
    return image


def _batch(policy: VisionLanguagePolicy, prompts: list, rows: list[int], seed: int) -> RolloutBatch:
    """Row b answers ``prompts[rows[b]]`` (its own copy of the image) with random tokens that
    are not vision tokens, right-padded to random lengths (row 0 has all T_MAX, row 1 one)."""
    encoded = policy.encode_prompts(prompts)  # (N, ...) per-row blocks
    index = torch.tensor(rows)
    B = len(rows)
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor(
        [i for i in range(len(policy.tokenizer)) if i not in set(policy.vision_ids)]
    )
    completion_ids = allowed[torch.randint(len(allowed), (B, T_MAX), generator=g)]
    lengths = torch.randint(1, T_MAX + 1, (B,), generator=g)
    lengths[:2] = torch.tensor([T_MAX, 1])
    completion_mask = (torch.arange(T_MAX) < lengths.unsqueeze(1)).float()  # (B, T)
    return RolloutBatch(
        prompt_ids=encoded["input_ids"][index],
        prompt_mask=encoded["attention_mask"][index],
        completion_ids=completion_ids.masked_fill(
            completion_mask == 0, policy.tokenizer.pad_token_id
        ),
        completion_mask=completion_mask,
        old_logp=torch.empty(0),
        completion_texts=[""] * B,
        prompt_index=index,
        group_size=1,
        extras={
            k: encoded[k][index] for k in ("mm_token_type_ids", "pixel_values", "image_grid_thw")
        },
        pad_id=policy.tokenizer.pad_token_id,
        prompt_extras=("mm_token_type_ids",),
    )


def _score(model, processor, batch: RolloutBatch, **sampling) -> dict:
    """Log-probs, entropy, no-image log-probs, the gradient of a fixed weighted sum of the
    log-probs, and the row count of every language-model forward."""
    policy = VisionLanguagePolicy(model, processor, SamplingSettings(**sampling))
    rows: list[int] = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["inputs_embeds"].shape[0]), with_kwargs=True
    )
    model.zero_grad(set_to_none=True)
    try:
        logp, entropy = policy.completion_logprobs(batch, with_entropy=True)
        image_rows = list(rows)
        without = policy.no_image_logprobs(batch)
    finally:
        hook.remove()
    g = torch.Generator().manual_seed(1)
    weights = torch.randn(logp.shape, generator=g) * batch.completion_mask  # (B, T)
    (logp * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {
        "logp": logp.detach(),
        "entropy": entropy,
        "without": without,
        "grads": grads,
        "rows": image_rows,
        "no_image_rows": rows[len(image_rows) :],
    }


def _compare(model, processor, batch: RolloutBatch, **sampling) -> dict:
    model.train()
    shared = _score(model, processor, batch, shared_prefix=True, **sampling)
    plain = _score(model, processor, batch, shared_prefix=False, **sampling)
    mask = batch.completion_mask.bool()
    for key in ("logp", "entropy", "without"):
        torch.testing.assert_close(shared[key][mask], plain[key][mask], rtol=1e-6, atol=1e-6)
    assert shared["grads"].keys() == plain["grads"].keys()
    assert any(".visual." in name for name in plain["grads"]), "the image gets a gradient"
    for name, grad in plain["grads"].items():
        error = (shared["grads"][name] - grad).norm() / grad.norm().clamp(min=1e-12)
        assert error < 1e-5, f"{name}: relative gradient error {error:.2e}"
    assert plain["rows"] == plain["no_image_rows"] == [batch.batch_size]
    return shared


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_whole_groups_with_images_equal_the_plain_forward(
    make_vl_model, vl_processor, vl_prompts, attn_implementation
):
    """Four prompts (one with a wide picture, so the pixel blocks are padded) x G = 3."""
    model = make_vl_model()
    model.config._attn_implementation = attn_implementation
    policy = VisionLanguagePolicy(model, vl_processor, SamplingSettings())
    batch = _batch(policy, vl_prompts, [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3, seed=0)
    shared = _compare(model, vl_processor, batch)
    assert shared["rows"] == [4, 12], "4 prompts with their images once, then 12 completions"
    assert shared["no_image_rows"] == [4, 12]


def test_equal_texts_with_other_images_are_not_one_run(make_vl_model, vl_processor):
    """Two groups ask the same question of different pictures: the image pass runs both
    prompts, the no-image pass (the same text twice) runs one."""
    model = make_vl_model(seed=1)
    policy = VisionLanguagePolicy(model, vl_processor, SamplingSettings())
    prompts = [("How many circles?", _picture("red")), ("How many circles?", _picture("blue"))]
    batch = _batch(policy, prompts, [0, 0, 0, 1, 1, 1], seed=1)
    assert torch.equal(batch.prompt_ids[0], batch.prompt_ids[3])
    shared = _compare(model, vl_processor, batch)
    assert shared["rows"] == [2, 6]
    assert shared["no_image_rows"] == [1, 6]


def test_a_shuffled_minibatch_and_small_chunks(make_vl_model, vl_processor, vl_prompts):
    """Runs 2, 1, 3, 1, 1 (prompt 0 in two runs), temperature 0.7, 3 positions a chunk."""
    model = make_vl_model(seed=2)
    policy = VisionLanguagePolicy(model, vl_processor, SamplingSettings())
    batch = _batch(policy, vl_prompts, [0, 0, 1, 2, 2, 2, 0, 3], seed=2)
    shared = _compare(model, vl_processor, batch, temperature=0.7, logprob_chunk_size=3)
    assert shared["rows"] == [5, 8]


def test_a_single_completion_token_needs_only_the_prompt_pass(
    make_vl_model, vl_processor, vl_prompts
):
    model = make_vl_model(seed=3)
    policy = VisionLanguagePolicy(model, vl_processor, SamplingSettings())
    full = _batch(policy, vl_prompts[:2], [0, 0, 1, 1], seed=3)
    batch = dataclasses.replace(
        full, completion_ids=full.completion_ids[:, :1], completion_mask=full.completion_mask[:, :1]
    )
    shared = _compare(model, vl_processor, batch)
    assert shared["rows"] == [2]


def test_split_positions_are_get_rope_index_over_the_whole_sequence(
    make_vl_model, vl_processor, vl_prompts
):
    """The prompt's 3-D positions once per run, the completion's by arithmetic: exactly what
    transformers' get_rope_index derives over [prompt, completion] row by row, padding and
    the wide picture's other grid included."""
    model = make_vl_model()
    policy = VisionLanguagePolicy(model, vl_processor, SamplingSettings())
    batch = _batch(policy, vl_prompts, [0, 0, 1, 2, 2, 2, 3, 3, 0], seed=5)
    expected, _ = model.model.get_rope_index(
        torch.cat([batch.prompt_ids, batch.completion_ids], dim=1),
        mm_token_type_ids=torch.cat(
            [batch.extras["mm_token_type_ids"], torch.zeros_like(batch.completion_ids)], dim=1
        ),
        image_grid_thw=batch.extras["image_grid_thw"],
        attention_mask=torch.cat([batch.prompt_mask, batch.completion_mask.long()], dim=1),
    )
    assert torch.equal(sequence_rope_positions(model.model, batch), expected)
    # Kept per prompt row: a second batch of the same prompts derives none of them again.
    cache = {}
    assert torch.equal(sequence_rope_positions(model.model, batch, cache), expected)
    assert len(cache) == 4
    derive = model.model.get_rope_index
    model.model.get_rope_index = None  # not called
    try:
        again = _batch(policy, vl_prompts, [3, 3, 0, 1], seed=6)
        positions = sequence_rope_positions(model.model, again, cache)
    finally:
        model.model.get_rope_index = derive
    expected, _ = derive(
        torch.cat([again.prompt_ids, again.completion_ids], dim=1),
        mm_token_type_ids=torch.cat(
            [again.extras["mm_token_type_ids"], torch.zeros_like(again.completion_ids)], dim=1
        ),
        image_grid_thw=again.extras["image_grid_thw"],
        attention_mask=torch.cat([again.prompt_mask, again.completion_mask.long()], dim=1),
    )
    assert torch.equal(positions, expected)
