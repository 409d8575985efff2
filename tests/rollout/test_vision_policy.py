"""VisionLanguagePolicy: image rollouts, minibatch-safe extras, entropy and the no-image pass.

A real tiny Qwen2.5-VL samples every batch. One prompt has a wide picture (40 patches instead
of 64), so the per-row pixel blocks really are padded and regrouped.
"""

import pytest
import torch
from PIL import Image, ImageDraw

from creditflow.algorithms import topp_entropy
from creditflow.models import (
    build_tiny_processor,
    build_tiny_qwen2_5_vl,
    sequence_forward_inputs,
    text_only_prompt_inputs,
    train_vl_tokenizer,
    vision_token_ids,
    vl_prompt_inputs,
)
from creditflow.rollout import (
    Policy,
    RolloutBatch,
    SamplingSettings,
    VisionLanguagePolicy,
    VisualPrompt,
    as_visual_prompt,
    vision_policy,
)
from creditflow.rollout.prompt_cache import (
    PromptEncodingCache,
    encoded_bytes,
    left_padded_batch,
    split_rows,
)
from creditflow.rollout.vision_policy import (
    flat_pixel_values,
    per_row_pixel_values,
    strip_prompt_tokens,
)
from creditflow.tasks.tor import (
    decode_image,
    format_tor_target,
    generate_tor_problems,
    tor_prompt,
)
from creditflow.training.evaluation import (
    evaluate_policy_sampled,
    sampled_completions,
    score_completions,
)

TINY_VL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
    "vision_depth": 1,
}


@pytest.fixture(scope="session")
def tor_tasks():
    return generate_tor_problems(12, seed=0)


@pytest.fixture(scope="session")
def vl_processor(tor_tasks):
    texts = [tor_prompt(q) for q in tor_tasks["question"]]
    texts += [
        format_tor_target(r, a)
        for r, a in zip(tor_tasks["reasoning"], tor_tasks["answer"], strict=True)
    ]
    return build_tiny_processor(train_vl_tokenizer(texts * 3, vocab_size=300), image_size=112)


@pytest.fixture(scope="session")
def make_vl_model(vl_processor):
    """A fresh, untrained tiny Qwen2.5-VL (same weights for the same seed) on each call."""
    return lambda seed=0: build_tiny_qwen2_5_vl(vl_processor, **TINY_VL, seed=seed)


def wide_picture() -> Image.Image:
    image = Image.new("RGB", (224, 112), "white")
    ImageDraw.Draw(image).rectangle((20, 20, 120, 90), fill="red")
    return image


@pytest.fixture(scope="session")
def vl_prompts(tor_tasks) -> list:
    """Three (text, PNG bytes) task prompts and one (text, PIL image) prompt with a wide image."""
    rows = [
        (tor_prompt(q), png)
        for q, png in zip(tor_tasks["question"], tor_tasks["image_png"], strict=True)
    ]
    return [*rows[:3], ("How many red squares are there?", wide_picture())]


def _policy(model, processor, **sampling) -> VisionLanguagePolicy:
    return VisionLanguagePolicy(
        model, processor, SamplingSettings(**{"max_new_tokens": 10, **sampling})
    )


def _spy_generate(model) -> dict:
    """Make ``model.generate`` also keep the raw per-step logits it sampled from."""
    generate, seen = model.generate, {}

    def spying_generate(**kwargs):
        seen["kwargs"] = kwargs
        out = generate(**kwargs, output_logits=True, return_dict_in_generate=True)
        seen["logits"] = torch.stack(out.logits, dim=1)  # (B, T, V)
        return out.sequences

    model.generate = spying_generate
    return seen


@pytest.fixture(scope="module")
def sampled(make_vl_model, vl_processor, vl_prompts):
    """A policy and its rollout: 4 prompts x G = 2, with entropy."""
    model = make_vl_model()
    policy = _policy(model, vl_processor)
    seen = _spy_generate(model)
    torch.manual_seed(0)
    batch = policy.sample(vl_prompts, group_size=2, with_entropy=True)
    del model.generate
    return policy, batch, seen


def test_sample_groups_rows_and_keeps_each_rows_image(sampled, vl_processor, vl_prompts):
    policy, batch, _ = sampled
    B, T = batch.completion_ids.shape
    assert B == 8 and 1 <= T <= 10 and batch.group_size == 2
    assert batch.prompt_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # 112 x 112 -> 8 x 8 = 64 patches; 224 x 112 -> 4 x 10 = 40 patches (padded to 64).
    assert batch.extras["image_grid_thw"].tolist() == [[1, 8, 8]] * 6 + [[1, 4, 10]] * 2
    pixels = batch.extras["pixel_values"]
    assert pixels.shape == (8, 64, 3 * 2 * 14 * 14)
    assert not pixels[6:, 40:].any(), "padding patches of the wide image are zero"
    texts = [as_visual_prompt(p).text for p in vl_prompts]
    direct = vl_prompt_inputs(vl_processor, texts, [as_visual_prompt(p).image for p in vl_prompts])
    # Row 2g and 2g+1 carry prompt g's patches; flattened they are the processor's layout.
    torch.testing.assert_close(
        flat_pixel_values(pixels[::2], batch.extras["image_grid_thw"][::2]),
        direct["pixel_values"],
        rtol=0,
        atol=0,
    )
    torch.testing.assert_close(batch.prompt_ids, direct["input_ids"].repeat_interleave(2, 0))
    torch.testing.assert_close(
        batch.extras["mm_token_type_ids"], direct["mm_token_type_ids"].repeat_interleave(2, 0)
    )
    assert (batch.prompt_mask[:, -1] == 1).all(), "prompts are left-padded"
    # After the first EOS: padding in ids and mask; no vision token is ever sampled.
    eos, pad = policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id
    for row in range(B):
        n = int(batch.completion_mask[row].sum())
        ids = batch.completion_ids[row].tolist()
        assert eos not in ids[: n - 1] and set(ids[n:]) <= {pad}
        assert batch.completion_mask[row, :n].all() and not batch.completion_mask[row, n:].any()
    assert not set(batch.completion_ids.flatten().tolist()) & set(policy.vision_ids)
    assert isinstance(policy, Policy)


def test_old_logp_is_the_distribution_generate_sampled_from(sampled):
    """old_logp equals the log_softmax of the raw logits generate() produced for each token."""
    _, batch, seen = sampled
    assert seen["kwargs"]["suppress_tokens"] == vision_token_ids(sampled[0].tokenizer)
    logits = seen["logits"][:, : batch.completion_ids.shape[1]].float()  # (B, T, V)
    expected = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    counted = batch.completion_mask.bool()
    torch.testing.assert_close(batch.old_logp[counted], expected[counted], rtol=0, atol=1e-4)


def test_entropy_is_topp_entropy_of_the_same_logits(sampled):
    policy, batch, _ = sampled
    with torch.no_grad():
        logits = policy.completion_logits(batch)  # (B, T, V)
    torch.testing.assert_close(batch.entropy, topp_entropy(logits, top_p=0.95), rtol=0, atol=1e-6)
    # And the log-probs of that forward are the rollout's.
    logp = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    torch.testing.assert_close(logp, batch.old_logp, rtol=0, atol=1e-5)


def test_minibatch_logprobs_equal_full_batch_ones(sampled):
    """select() cuts the per-row pixel blocks with the rows, so any minibatch - the wide image
    included, in any order - scores exactly as in the full batch."""
    policy, batch, _ = sampled
    for rows in ([7, 0, 3], [6], [1, 2, 4, 5]):
        sub = batch.select(torch.tensor(rows))
        assert sub.extras["pixel_values"].shape[0] == len(rows)
        logp, entropy = policy.completion_logprobs(sub, with_entropy=True)
        counted = sub.completion_mask.bool()
        torch.testing.assert_close(logp[counted], batch.old_logp[rows][counted], rtol=0, atol=1e-5)
        torch.testing.assert_close(
            entropy[counted], batch.entropy[rows][counted], atol=1e-5, rtol=0
        )


def test_logprobs_are_differentiable_and_temperature_scaled(
    make_vl_model, vl_processor, vl_prompts
):
    model = make_vl_model()
    hot = _policy(model, vl_processor, temperature=2.0)
    torch.manual_seed(1)
    batch = hot.sample(vl_prompts[:2], group_size=2)
    logits = _policy(model, vl_processor).completion_logits(batch) / 2.0
    expected = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    logp, entropy = hot.completion_logprobs(batch)
    assert entropy is None and logp.requires_grad
    torch.testing.assert_close(logp.detach(), expected.detach(), rtol=0, atol=1e-5)


def test_chunked_scoring_equals_the_single_pass_with_gradients(sampled, make_vl_model):
    """Scoring 3 positions at a time gives the plain forward's log-softmax, its
    top-p entropy and its gradient, the vision tower's included."""
    policy, batch, _ = sampled
    model = make_vl_model()
    chunked = _policy(model, policy.processor, logprob_chunk_size=3)
    logits = chunked.completion_logits(batch)  # (B, T, V)
    expected = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in trained], [p for _, p in trained]
    expected_grads = torch.autograd.grad(expected.sum(), params, allow_unused=True)
    logp, entropy = chunked.completion_logprobs(batch, with_entropy=True)
    torch.testing.assert_close(logp, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy, topp_entropy(logits.detach()), rtol=1e-6, atol=1e-6)
    grads = torch.autograd.grad(logp.sum(), params, allow_unused=True)
    visual = [g for n, g in zip(names, grads, strict=True) if "visual" in n and g is not None]
    assert visual and any(g.abs().sum() > 0 for g in visual), "the image gets a gradient"
    for name, got, want in zip(names, grads, expected_grads, strict=True):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


def test_no_image_pass_equals_a_text_only_model_call(sampled, vl_processor, vl_prompts):
    """Row by row, unpadded: the text-only chat turn (no vision tokens, no pixels) followed by
    the completion, through the plain model call of models.vision."""
    policy, batch, _ = sampled
    without = policy.no_image_logprobs(batch)  # (B, T)
    assert without.shape == batch.old_logp.shape and not without.requires_grad
    for row in range(batch.batch_size):
        text = as_visual_prompt(vl_prompts[row // 2]).text
        prompt = text_only_prompt_inputs(vl_processor, [text])
        n = int(batch.completion_mask[row].sum())
        ids = batch.completion_ids[row : row + 1, :n]
        inputs = sequence_forward_inputs(prompt, ids, torch.ones_like(ids))
        assert "pixel_values" not in inputs
        with torch.no_grad():
            logits = policy.module(**inputs).logits[:, -n - 1 : -1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[..., None])[0, :, 0]
        torch.testing.assert_close(without[row, :n], expected, rtol=0, atol=1e-5)
    # The image matters: removing it moves the log-probs (ToR's visual sensitivity).
    counted = batch.completion_mask.bool()
    assert (without - batch.old_logp)[counted].abs().max() > 1e-3


def test_strip_prompt_tokens_removes_ids_and_left_pads():
    # Rows: [pad, 5, 9, 9, 6] and [7, 9, 8, 5, 6]; dropping 9 leaves [5, 6] and [7, 8, 5, 6].
    ids = torch.tensor([[0, 5, 9, 9, 6], [7, 9, 8, 5, 6]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    out_ids, out_mask = strip_prompt_tokens(ids, mask, [9], pad_id=0)
    assert out_ids.tolist() == [[0, 0, 5, 6], [7, 8, 5, 6]]
    assert out_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_stripping_the_image_gives_the_text_only_rendering(sampled, vl_processor, vl_prompts):
    policy, batch, _ = sampled
    ids, mask = strip_prompt_tokens(
        batch.prompt_ids[::2], batch.prompt_mask[::2], policy.vision_ids, 0
    )
    text_only = text_only_prompt_inputs(
        vl_processor, [as_visual_prompt(p).text for p in vl_prompts]
    )
    assert torch.equal(ids, text_only["input_ids"]) and torch.equal(
        mask, text_only["attention_mask"]
    )


@pytest.mark.parametrize("counts", [[64, 40, 32], [4], [9, 9]])
def test_per_row_pixel_blocks_round_trip(counts):
    grid = torch.tensor([[1, 1, n] for n in counts])
    flat = torch.randn(sum(counts), 6)
    rows = per_row_pixel_values(flat, grid)
    assert rows.shape == (len(counts), max(counts), 6)
    assert torch.equal(flat_pixel_values(rows, grid), flat)
    # Reversed rows regroup to the images' patches in the reversed order.
    starts = [sum(counts[:b]) for b in range(len(counts))]
    reversed_flat = torch.cat([flat[s : s + n] for s, n in zip(starts, counts, strict=True)][::-1])
    assert torch.equal(flat_pixel_values(rows.flip(0), grid.flip(0)), reversed_flat)


def test_greedy_decodes_are_deterministic(make_vl_model, vl_processor, vl_prompts):
    policy = _policy(make_vl_model(), vl_processor, max_new_tokens=5)
    first = policy.greedy(vl_prompts)
    assert len(first) == 4 and policy.greedy(vl_prompts) == first
    assert not policy.module.training


def test_as_visual_prompt_accepts_pairs_and_refuses_the_rest(tor_tasks):
    png = tor_tasks["image_png"][0]
    from_bytes = as_visual_prompt(("q", png))
    assert from_bytes.text == "q" and from_bytes.image.tobytes() == decode_image(png).tobytes()
    prompt = VisualPrompt("q", decode_image(png))
    assert as_visual_prompt(prompt) is prompt
    for bad in ("just text", ("q",), (png, "q")):
        with pytest.raises(TypeError, match="a vision-language prompt is a VisualPrompt"):
            as_visual_prompt(bad)


def test_policy_needs_a_pad_token(make_vl_model, vl_processor):
    model = make_vl_model()
    tokenizer = vl_processor.tokenizer
    saved = tokenizer.pad_token
    tokenizer.pad_token = None
    try:
        with pytest.raises(ValueError, match="no pad token"):
            _policy(model, vl_processor)
    finally:
        tokenizer.pad_token = saved


def test_rollout_batch_select_is_plain_rows_for_vl_extras(sampled):
    _, batch, _ = sampled
    sub = batch.select(torch.tensor([6, 7]))
    assert isinstance(sub, RolloutBatch)
    assert sub.extras["image_grid_thw"].tolist() == [[1, 4, 10]] * 2
    assert torch.equal(sub.extras["pixel_values"], batch.extras["pixel_values"][6:])


def test_evaluate_policy_sampled_averages_each_prompts_samples(
    make_vl_model, vl_processor, vl_prompts, tor_tasks
):
    model = make_vl_model()
    prompts = vl_prompts[:3]
    references = list(tor_tasks["question"][:3])  # chrF++ against them varies between samples
    answers = list(tor_tasks["answer"][:3])
    table = evaluate_policy_sampled(
        model,
        vl_processor,
        prompts,
        references,
        answers,
        ["translation", "reasoning"],
        max_new_tokens=8,
        samples_per_prompt=3,
        batch_size=4,
        seed=7,
    )
    assert list(table.columns) == ["reward/translation", "reward/reasoning"]
    assert len(table) == 3
    # The slow way: the same seeded draws, each scored, averaged by hand per prompt.
    policy = _policy(model, vl_processor, max_new_tokens=8)
    texts = sampled_completions(policy, prompts, 3, batch_size=4, seed=7)
    assert len(set(texts)) > 1, "the samples differ, so the mean is not one completion's score"
    for row in range(3):
        scores = score_completions(
            texts[3 * row : 3 * row + 3], [references[row]] * 3, [answers[row]] * 3, ["translation"]
        )
        assert table["reward/translation"][row] == pytest.approx(
            scores["reward/translation"].mean()
        )
    again = evaluate_policy_sampled(
        model,
        vl_processor,
        prompts,
        references,
        answers,
        ["translation"],
        8,
        3,
        batch_size=4,
        seed=7,
    )
    assert again["reward/translation"].tolist() == table["reward/translation"].tolist()


def _batch_encoding(processor, prompts) -> dict:
    """The whole batch through the processor at once: the reference the cache must equal."""
    visual = [as_visual_prompt(p) for p in prompts]
    inputs = vl_prompt_inputs(processor, [p.text for p in visual], [p.image for p in visual])
    inputs["pixel_values"] = per_row_pixel_values(inputs["pixel_values"], inputs["image_grid_thw"])
    return inputs


def test_cached_prompt_encodings_equal_the_processors_batch(
    make_vl_model, vl_processor, vl_prompts, monkeypatch
):
    policy = _policy(make_vl_model(), vl_processor)
    calls = []
    real = vision_policy.vl_prompt_inputs
    monkeypatch.setattr(
        vision_policy, "vl_prompt_inputs", lambda *a: calls.append(len(a[1])) or real(*a)
    )
    # Different prompt lengths and image sizes (the wide picture has twice the patches), a
    # repeat within the batch, then the same prompts again in another order and subset.
    batches = [vl_prompts + vl_prompts[:1], vl_prompts[::-1], [vl_prompts[2], vl_prompts[3]]]
    for prompts in batches:
        cached = policy.encode_prompts(prompts)
        reference = _batch_encoding(vl_processor, prompts)
        assert set(cached) == set(reference)
        for key, value in reference.items():
            assert cached[key].dtype == value.dtype, key
            assert torch.equal(cached[key], value), key
    assert calls == [4]  # the four distinct prompts in one processor call, then none
    # A prompt given as a PIL image and as the same PNG's bytes are two keys, one encoding.
    png = vl_prompts[0][1]
    as_image = (vl_prompts[0][0], decode_image(png))
    assert torch.equal(
        policy.encode_prompts([as_image])["pixel_values"],
        policy.encode_prompts([vl_prompts[0]])["pixel_values"],
    )


def test_a_zero_prompt_budget_encodes_every_batch_as_the_processor_does(
    make_vl_model, vl_processor, vl_prompts
):
    policy = VisionLanguagePolicy(
        make_vl_model(), vl_processor, SamplingSettings(max_new_tokens=4), prompt_cache_bytes=0
    )
    prompts = vl_prompts + vl_prompts[:1]
    for _ in range(2):
        encoded = policy.encode_prompts(prompts)
        reference = _batch_encoding(vl_processor, prompts)
        assert all(torch.equal(encoded[key], value) for key, value in reference.items())
    assert len(policy._encodings) == 0


def _one_prompt_batch(n: int) -> dict:
    """A processor-like batch of ``n`` rows of 4 tokens and 2 patches each."""
    return {
        "input_ids": torch.ones(n, 4, dtype=torch.long),
        "attention_mask": torch.ones(n, 4, dtype=torch.long),
        "mm_token_type_ids": torch.zeros(n, 4, dtype=torch.long),
        "pixel_values": torch.zeros(2 * n, 8),
        "image_grid_thw": torch.tensor([[1, 1, 2]] * n),
    }


def test_prompt_encoding_cache_keeps_to_its_byte_budget():
    size = encoded_bytes(split_rows(_one_prompt_batch(1))[0])
    cache = PromptEncodingCache(max_bytes=2 * size)
    encoded = []

    def encode(indices):
        encoded.append(indices)
        return _one_prompt_batch(len(indices))

    cache.rows(["a", "b", "a"], encode)
    cache.rows(["a"], encode)  # kept: a is now the most recent
    cache.rows(["c"], encode)  # drops b, the least recently used
    assert len(cache) == 2 and encoded == [[0, 1], [0]]
    cache.rows(["b", "a"], encode)
    assert encoded[-1] == [0]  # b again, a still kept
    # A processor output with keys of its own is not cached: the caller encodes the batch.
    extra = lambda indices: {**_one_prompt_batch(len(indices)), "second_per_grid_ts": None}  # noqa: E731
    assert cache.rows(["d"], extra) is None


def test_split_rows_inverts_left_padding():
    batch = {
        "input_ids": torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]]),
        "attention_mask": torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]),
        "mm_token_type_ids": torch.tensor([[0, 0, 1, 0], [0, 1, 1, 0]]),
        "pixel_values": torch.arange(10.0).reshape(5, 2),
        "image_grid_thw": torch.tensor([[1, 1, 2], [1, 1, 3]]),
    }
    rows = split_rows(batch)
    assert rows[0]["input_ids"].tolist() == [[5, 6]]
    assert rows[1]["pixel_values"].tolist() == [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]
    back = left_padded_batch(rows, pad_id=0)
    back["pixel_values"] = flat_pixel_values(back["pixel_values"], back["image_grid_thw"])
    for key, value in batch.items():
        assert torch.equal(back[key], value), key
