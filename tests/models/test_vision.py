"""The tiny Qwen2.5-VL policy: tokenizer, processor, forward/generate, positions, save/load."""

import json

import pytest
import torch
from PIL import Image, ImageDraw
from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2VLImageProcessorPil

from creditflow.models import (
    IMAGE_PAD_TOKEN,
    VISION_TOKENS,
    ImageOnlyQwen2_5_VLProcessor,
    build_tiny_processor,
    build_tiny_qwen2_5_vl,
    freeze_vision_encoder,
    load_policy,
    sequence_forward_inputs,
    text_only_prompt_inputs,
    train_vl_tokenizer,
    vision_token_ids,
    vl_prompt_inputs,
)
from creditflow.tasks.tor import COLORS, SHAPES, decode_image, generate_tor_problems

CORPUS = [
    "Look at the image and answer the question. Put the final answer in \\boxed{}.",
    "How many red circles plus blue squares are there?",
    "What is the height of bar B minus the height of bar A?",
    "Add the two numbers in the picture.",
    "2 red circles + 3 blue squares = 5. The answer is \\boxed{5}",
    "Bar B is 7 and bar A is 3. 7 - 3 = 4. The answer is \\boxed{4}",
]
PROMPTS = ["How many red circles?", "What is the height of bar B minus the height of bar A?"]
PATCH_DIM = 3 * 2 * 14 * 14  # channels * temporal_patch_size * patch_size**2 = 1176


@pytest.fixture(scope="module")
def vl_tokenizer():
    return train_vl_tokenizer(CORPUS * 10, vocab_size=400)


@pytest.fixture(scope="module")
def processor(vl_tokenizer):
    return build_tiny_processor(vl_tokenizer, image_size=112)


@pytest.fixture(scope="module")
def vl_model(processor):
    return build_tiny_qwen2_5_vl(processor)


def picture(color: str, size: int = 112) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    ImageDraw.Draw(image).ellipse((size // 8, size // 8, size // 2, size // 2), fill=color)
    ImageDraw.Draw(image).rectangle((size // 2, size // 2, size - 8, size - 8), fill="black")
    return image


@pytest.fixture(scope="module")
def images():
    return [picture("red"), picture("blue")]


@pytest.fixture(scope="module")
def prompt_inputs(processor, images):
    return vl_prompt_inputs(processor, PROMPTS, images)


def completion_mask_through_first_eos(completion_ids, eos_id):
    """(B, T) 1 up to and including the first eos, a plain loop on purpose."""
    mask = torch.zeros_like(completion_ids)
    for row in range(completion_ids.shape[0]):
        for t, token in enumerate(completion_ids[row].tolist()):
            mask[row, t] = 1
            if token == eos_id:
                break
    return mask


def completion_logprobs(model, inputs, completion_ids):
    """(B, T) log pi(o_t | prompt, o_<t) from one forward over [prompt, completion]."""
    T = completion_ids.shape[1]
    with torch.no_grad():
        logits = model(**inputs, logits_to_keep=T + 1).logits[:, :-1].float()  # (B, T, V)
    return torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def test_tokenizer_adds_the_vision_tokens_as_special_tokens(vl_tokenizer):
    ids = vision_token_ids(vl_tokenizer)
    n = len(vl_tokenizer)
    assert ids == list(range(n - 5, n))  # appended after the BPE vocabulary, in Qwen's order
    assert set(VISION_TOKENS) | {"<|im_start|>"} <= set(vl_tokenizer.all_special_tokens)
    text = "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>3 + 2"
    encoded = vl_tokenizer.encode(text)
    assert encoded[:4] == [ids[0], ids[3], ids[3], ids[1]]  # one id each, never split
    assert vl_tokenizer.decode(encoded, skip_special_tokens=True) == "3 + 2"
    assert (vl_tokenizer.pad_token_id, vl_tokenizer.eos_token_id) == (0, 2)


def test_chat_template_renders_the_image_item_qwen_style(vl_tokenizer):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi?"}]}]
    rendered = vl_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = vl_tokenizer.apply_chat_template([{"role": "user", "content": "Hi?"}], tokenize=False)
    assert plain == "<|im_start|>user\nHi?<|im_end|>\n"


@pytest.mark.parametrize("size", [112, 224])
def test_processor_turns_an_image_into_16_tokens(processor, size):
    # min_pixels = max_pixels = 112**2: 224 x 224 is resized to 112 x 112. 112 / 14 = 8 patches
    # a side -> 64 patches of 3 * 2 * 14 * 14 values; merge 2 x 2 -> 64 / 4 = 16 tokens.
    inputs = vl_prompt_inputs(processor, ["How many?"], [picture("red", size)])
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert inputs["pixel_values"].shape == (64, PATCH_DIM)
    image_pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)
    assert (inputs["input_ids"] == image_pad).sum() == 16
    assert torch.equal(inputs["mm_token_type_ids"], (inputs["input_ids"] == image_pad).long())
    assert isinstance(processor.image_processor, Qwen2VLImageProcessorPil)  # no torchvision


def test_prompt_inputs_are_left_padded(prompt_inputs):
    mask = prompt_inputs["attention_mask"]
    B, P = prompt_inputs["input_ids"].shape
    assert B == 2 and mask.shape == (B, P)
    assert mask[0, 0] == 0 and mask[:, -1].all()  # short prompt padded on the left
    assert torch.all(mask[:, 1:] >= mask[:, :-1])  # no hole after the first real token
    assert prompt_inputs["pixel_values"].shape == (2 * 64, PATCH_DIM)
    assert prompt_inputs["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8]]


def test_text_only_inputs_are_the_prompts_without_the_image(processor, prompt_inputs):
    text_only = text_only_prompt_inputs(processor, PROMPTS)
    assert set(text_only) == {"input_ids", "attention_mask", "mm_token_type_ids"}
    vision = set(vision_token_ids(processor.tokenizer))
    assert not any(token in vision for token in text_only["input_ids"].flatten().tolist())
    assert not text_only["mm_token_type_ids"].any()
    for row in range(len(PROMPTS)):
        real = text_only["input_ids"][row][text_only["attention_mask"][row].bool()].tolist()
        with_image = prompt_inputs["input_ids"][row][prompt_inputs["attention_mask"][row].bool()]
        assert real == [token for token in with_image.tolist() if token not in vision]


def test_config_comes_from_the_tokenizer_and_the_processor(vl_model, processor):
    config, tokenizer = vl_model.config, processor.tokenizer
    assert config.text_config.vocab_size == len(tokenizer)
    assert config.image_token_id == tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)
    assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size == 64
    assert config.vision_config.patch_size == processor.image_processor.patch_size == 14
    # head_dim 64 / 4 = 16 -> 8 frequencies split (t, h, w) = (2, 3, 3), as [16, 24, 24] of 64.
    assert config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]
    assert vl_model.lm_head.weight is vl_model.get_input_embeddings().weight  # tied
    assert vl_model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert not vl_model.training


def test_same_seed_same_weights_and_global_rng_untouched(processor, vl_model):
    torch.manual_seed(5)
    state = torch.get_rng_state()
    again = build_tiny_qwen2_5_vl(processor, seed=0).state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    for name, weight in vl_model.state_dict().items():
        assert torch.equal(again[name], weight), name
    other = build_tiny_qwen2_5_vl(processor, seed=1).state_dict()
    assert not torch.equal(
        other["model.visual.patch_embed.proj.weight"], again["model.visual.patch_embed.proj.weight"]
    )


def test_forward_gives_logits_over_the_vocabulary(vl_model, prompt_inputs, processor):
    with torch.no_grad():
        logits = vl_model(**prompt_inputs).logits
    B, P = prompt_inputs["input_ids"].shape
    assert logits.shape == (B, P, len(processor.tokenizer))  # (B, P, V)
    assert torch.isfinite(logits).all()


def test_the_image_changes_the_logits(vl_model, processor, images):
    red = vl_prompt_inputs(processor, PROMPTS[:1], images[:1])
    blue = vl_prompt_inputs(processor, PROMPTS[:1], images[1:])
    blind = text_only_prompt_inputs(processor, PROMPTS[:1])
    assert torch.equal(red["input_ids"], blue["input_ids"])  # only the pixels differ
    with torch.no_grad():
        last = [vl_model(**inputs).logits[0, -1] for inputs in (red, blue, blind)]
    assert (last[0] - last[1]).abs().max() > 1e-3
    assert (last[0] - last[2]).abs().max() > 1e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_one_forward_reproduces_the_sampling_logprobs(vl_model, processor, prompt_inputs, seed):
    """Left-padded image batch: log-probs from one forward over [prompt, completion] equal the
    log_softmax of generate()'s raw logits (temperature 1, no top-k/top-p)."""
    eos = processor.tokenizer.eos_token_id
    torch.manual_seed(seed)
    with torch.no_grad():
        out = vl_model.generate(
            **prompt_inputs,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=12,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
        )
    P = prompt_inputs["input_ids"].shape[1]
    completion_ids = out.sequences[:, P:]  # (B, T)
    B, T = completion_ids.shape
    assert B == 2 and 1 <= T <= 12
    mask = completion_mask_through_first_eos(completion_ids, eos)  # (B, T)
    sampled = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)  # (B, T, V)
    expected = sampled.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    # Unprocessed scores are the logits here: no processor changes them at temperature 1.
    torch.testing.assert_close(torch.stack(out.scores, 1), torch.stack(out.logits, 1))

    inputs = sequence_forward_inputs(prompt_inputs, completion_ids, mask)
    assert "position_ids" not in inputs
    recomputed = completion_logprobs(vl_model, inputs, completion_ids)
    counted = mask.bool()
    torch.testing.assert_close(recomputed[counted], expected[counted], rtol=0, atol=1e-4)


def test_positions_need_mm_token_type_ids(vl_model, processor, prompt_inputs):
    """Without mm_token_type_ids (or with text-style 2D position_ids) the image tokens get 1D
    positions and the log-probs drift: the reason sequence_forward_inputs passes them."""
    torch.manual_seed(0)
    with torch.no_grad():
        sequences = vl_model.generate(
            **prompt_inputs, do_sample=True, top_k=0, max_new_tokens=8, min_new_tokens=8
        )
    P = prompt_inputs["input_ids"].shape[1]
    completion_ids = sequences[:, P:]
    inputs = sequence_forward_inputs(prompt_inputs, completion_ids, torch.ones_like(completion_ids))
    right = completion_logprobs(vl_model, inputs, completion_ids)
    without_types = {k: v for k, v in inputs.items() if k != "mm_token_type_ids"}
    with_2d = {**inputs, "position_ids": (inputs["attention_mask"].cumsum(1) - 1).clamp(min=0)}
    for wrong in (without_types, with_2d):
        assert (completion_logprobs(vl_model, wrong, completion_ids) - right).abs().max() > 1e-4


def test_no_image_logprobs_do_not_depend_on_left_padding(vl_model, processor):
    """ToR's no-image pass: each row scores the same alone as in a left-padded batch."""
    batch = text_only_prompt_inputs(processor, PROMPTS)
    completion_ids = torch.tensor([[5, 17, 30, 2], [40, 41, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    together = completion_logprobs(
        vl_model, sequence_forward_inputs(batch, completion_ids, mask), completion_ids
    )
    for row, prompt in enumerate(PROMPTS):
        alone_inputs = text_only_prompt_inputs(processor, [prompt])
        alone = completion_logprobs(
            vl_model,
            sequence_forward_inputs(
                alone_inputs, completion_ids[row : row + 1], mask[row : row + 1]
            ),
            completion_ids[row : row + 1],
        )
        counted = mask[row].bool()
        torch.testing.assert_close(together[row][counted], alone[0][counted], rtol=0, atol=1e-5)


def test_a_sampled_image_token_breaks_the_recomputation(vl_model, processor, prompt_inputs):
    """Why a rollout engine suppresses vision_token_ids when sampling."""
    image_pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)
    completion_ids = torch.tensor([[7, image_pad], [7, 8]])
    inputs = sequence_forward_inputs(prompt_inputs, completion_ids, torch.ones_like(completion_ids))
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        with torch.no_grad():
            vl_model(**inputs)


def test_sequence_forward_inputs_layout_and_validation(prompt_inputs):
    completion_ids = torch.tensor([[5, 6, 2], [7, 2, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    inputs = sequence_forward_inputs(prompt_inputs, completion_ids, mask)
    P = prompt_inputs["input_ids"].shape[1]
    assert inputs["input_ids"].shape == (2, P + 3)
    assert torch.equal(inputs["attention_mask"][:, P:], mask)
    assert not inputs["mm_token_type_ids"][:, P:].any()
    assert inputs["pixel_values"] is prompt_inputs["pixel_values"]
    with pytest.raises(ValueError, match=r"must both be \(B, T\) with B = 2"):
        sequence_forward_inputs(prompt_inputs, completion_ids[:1], mask[:1])


def test_save_and_load_round_trip(tmp_path, vl_model, processor, images):
    vl_model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded_processor = AutoProcessor.from_pretrained(tmp_path)
    loaded_model = AutoModelForImageTextToText.from_pretrained(
        tmp_path, attn_implementation="eager"
    )
    assert isinstance(loaded_processor, ImageOnlyQwen2_5_VLProcessor)
    assert loaded_processor.tokenizer.padding_side == "left"
    before = vl_prompt_inputs(processor, PROMPTS, images)
    after = vl_prompt_inputs(loaded_processor, PROMPTS, images)
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    mask = before["attention_mask"].bool()
    with torch.no_grad():
        expected = vl_model(**before).logits[mask]
        torch.testing.assert_close(loaded_model(**after).logits[mask], expected, rtol=0, atol=0)
        model, proc = load_policy(
            {
                "source": "pretrained",
                "name_or_path": str(tmp_path),
                "dtype": "float32",
                "attn_implementation": "eager",
            }
        )
        torch.testing.assert_close(model(**before).logits[mask], expected, rtol=0, atol=0)
    assert proc.tokenizer.encode(CORPUS[1]) == processor.tokenizer.encode(CORPUS[1])


def test_pretrained_naming_the_stock_processor_loads_without_torchvision(
    tmp_path, vl_model, processor
):
    """A real Qwen2.5-VL checkpoint names Qwen2_5_VLProcessor, which needs torchvision."""
    vl_model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    config_file = tmp_path / "processor_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "processor_class": "Qwen2_5_VLProcessor"}))
    model, proc = load_policy({"source": "pretrained", "name_or_path": tmp_path})
    assert isinstance(proc.image_processor, Qwen2VLImageProcessorPil)
    assert proc.tokenizer.padding_side == "left"
    assert not model.training


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"source": "hub"}, r"unknown policy source 'hub'; valid: \['pretrained', 'tiny'\]"),
        ({}, "unknown policy source None"),
        ({"source": "pretrained"}, "needs 'name_or_path': set it in parameters"),
        ({"source": "pretrained", "name_or_path": "x", "dtype": "fp8"}, "unknown dtype 'fp8'"),
        (
            {"source": "pretrained", "name_or_path": "x", "attn_implementation": "flash"},
            "unknown attn_implementation",
        ),
        (
            {"source": "pretrained", "name_or_path": "x", "revison": "main"},
            r"unknown keys \['revison'\]",
        ),
        (
            {"source": "pretrained", "name_or_path": "x", "trust_remote_code": "no"},
            "must be true or false",
        ),
        ({"source": "tiny", "tiny": {"width": 8}}, r"unknown keys \['width'\] under 'tiny'"),
        ({"source": "tiny", "tiny": {"vision_hidden_size": 20}}, "must be divisible by 4"),
        ({"source": "tiny", "tiny": {"hidden_size": 62}}, "divisible by num_attention_heads"),
    ],
)
def test_invalid_specs_fail_before_loading(processor, spec, match):
    with pytest.raises(ValueError, match=match):
        load_policy(spec, processing_class=processor)


def test_tiny_needs_a_processor():
    with pytest.raises(
        ValueError, match=r"load_policy\(spec, processing_class=...\).* a processor"
    ):
        load_policy({"source": "tiny"})


def test_tiny_spec_builds_what_the_builder_builds(processor):
    spec = {"source": "tiny", "tiny": {"hidden_size": 32, "vision_depth": 1, "seed": 3}}
    model, proc = load_policy(spec, processing_class=processor)
    direct = build_tiny_qwen2_5_vl(processor, hidden_size=32, vision_depth=1, seed=3)
    assert proc is processor
    for name, weight in direct.state_dict().items():
        assert torch.equal(model.state_dict()[name], weight), name


def test_missing_checkpoint_says_what_to_do(tmp_path):
    with pytest.raises(OSError, match="could not load the policy checkpoint"):
        load_policy({"source": "pretrained", "name_or_path": str(tmp_path / "nowhere")})


def test_processor_needs_the_vision_tokens_and_a_fitting_image_size(tokenizer, vl_tokenizer):
    with pytest.raises(ValueError, match="lacks the vision tokens"):
        build_tiny_processor(tokenizer)  # the text-only TAPO tokenizer of conftest.py
    with pytest.raises(ValueError, match="multiple of patch_size \\* merge_size = 28"):
        build_tiny_processor(vl_tokenizer, image_size=100)
    with pytest.raises(ValueError, match="lacks the vision tokens"):
        build_tiny_qwen2_5_vl(tokenizer)


def test_freeze_vision_encoder_keeps_the_merger_and_the_language_model_trainable(processor):
    model = freeze_vision_encoder(build_tiny_qwen2_5_vl(processor))
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(".visual." in f".{n}" and ".merger." not in n for n in frozen)
    assert "model.visual.patch_embed.proj.weight" in frozen
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(".merger." in n for n in trainable)
    assert any(".language_model." in n for n in trainable)  # the head is tied to the embedding
    with pytest.raises(ValueError, match="no vision tower"):
        freeze_vision_encoder(torch.nn.Linear(2, 2))


def test_the_initial_encoder_keeps_each_grid_cell_apart(processor):
    """Why the frozen ViT suffices for counting (docs/results.md "The ToR world"): at 112 px each of the
    16 image tokens covers one cell of the 4 x 4 board, and a linear read-out of the randomly
    initialised tower's tokens tells every cell's content (empty or one of 9 colour-shape
    kinds) apart on held-out pictures (measured 1.000 on 40 pictures' 640 tokens, where
    answering "empty" scores 0.63)."""
    kinds = [(color, shape) for color in COLORS for shape in SHAPES]
    problems = generate_tor_problems(160, seed=1, kinds=["count_shapes"], max_count=3)
    model = build_tiny_qwen2_5_vl(processor)
    pixels = processor.image_processor(
        images=[decode_image(png) for png in problems["image_png"]], return_tensors="pt"
    )
    with torch.no_grad():
        out = model.model.visual(pixels["pixel_values"], grid_thw=pixels["image_grid_thw"])
    tokens = out.pooler_output.reshape(len(problems) * 16, -1)  # (n * 16, hidden) merged
    labels = torch.zeros(len(problems), 16, dtype=torch.long)
    for row, spec in enumerate(problems["spec"]):
        for item in json.loads(spec)["shapes"]:
            labels[row, item["cell"]] = 1 + kinds.index((item["color"], item["shape"]))
    labels = labels.reshape(-1)  # (n * 16,) token k of a picture is cell k
    n_fit = 120 * 16
    tokens = (tokens - tokens[:n_fit].mean(0)) / tokens[:n_fit].std(0).clamp(min=1e-6)
    probe = torch.nn.Linear(tokens.shape[1], 1 + len(kinds))
    optimizer = torch.optim.Adam(probe.parameters(), lr=1e-2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        probe.reset_parameters()
        for _ in range(300):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(probe(tokens[:n_fit]), labels[:n_fit]).backward()
            optimizer.step()
    held_out = probe(tokens[n_fit:]).argmax(dim=1) == labels[n_fit:]
    majority = (labels[n_fit:] == 0).float().mean()
    assert held_out.float().mean() > 0.95 > majority + 0.2
