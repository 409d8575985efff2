"""ExpScorer (docs/methods/experience.md, step 3): last-real-token pooling, either padding side, save/load round trip."""

import io
import json

import pytest
import torch
from PIL import Image

from creditflow.chain.expmodel.scorer import CONFIG_FILE, ExpScorer, last_token_index
from creditflow.chain.world.catalogue import generate_catalogue
from creditflow.models import (
    build_tiny_processor,
    build_tiny_qwen2,
    build_tiny_qwen2_5_vl,
    train_vl_tokenizer,
    vl_prompt_inputs,
)

TINY_VL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
    "vision_depth": 1,
    "vision_hidden_size": 32,
    "vision_num_heads": 2,
    "vision_intermediate_size": 64,
}


@pytest.fixture(scope="module")
def items():
    return generate_catalogue(5, seed=1, image_size=56)


@pytest.fixture(scope="module")
def processor(items):
    return build_tiny_processor(train_vl_tokenizer(list(items["title"]) * 5, vocab_size=400), 56)


@pytest.fixture(scope="module")
def inputs(items, processor):
    """Left-padded: titles of different lengths give rows with 0 to several pads."""
    images = [Image.open(io.BytesIO(png)).convert("RGB") for png in items["image_png"]]
    return vl_prompt_inputs(processor, list(items["title"]), images)


def make_scorer(processor, seed=0):
    """A scorer with a seeded non-zero head, so scores differ between items."""
    scorer = ExpScorer.from_generator(build_tiny_qwen2_5_vl(processor, seed=seed, **TINY_VL))
    torch.nn.init.normal_(scorer.head.weight, generator=torch.Generator().manual_seed(seed))
    torch.nn.init.constant_(scorer.head.bias, 0.25)
    return scorer.eval()


def test_last_token_index_by_hand():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [4, 1, 0, 4]
    with pytest.raises(ValueError, match="at least one real token"):
        last_token_index(torch.tensor([[1, 1], [0, 0]]))
    with pytest.raises(ValueError, match=r"\(B, P\)"):
        last_token_index(torch.ones(4))


def test_untrained_head_scores_zero(processor, inputs):
    scorer = ExpScorer.from_generator(build_tiny_qwen2_5_vl(processor, **TINY_VL))
    with torch.no_grad():
        scores = scorer(**inputs)
    assert scores.shape == (5,) and scores.dtype == torch.float32
    assert torch.equal(scores, torch.zeros(5))


def test_score_is_the_head_on_the_last_real_token_state(processor, inputs):
    scorer = make_scorer(processor)
    assert inputs["attention_mask"][:, 0].min() == 0  # some row is really padded
    with torch.no_grad():
        scores = scorer(**inputs)
        hidden = scorer.backbone(**inputs, use_cache=False).last_hidden_state  # (B, P, H)
    # Left padding: the last real token is the last column of every row.
    expected = hidden[:, -1] @ scorer.head.weight[0] + scorer.head.bias
    torch.testing.assert_close(scores, expected)


def test_left_and_right_padding_give_the_same_scores(processor, inputs):
    """Move each row's real tokens to the front: positions come from the mask, so only float
    rounding may differ."""
    right = {k: v.clone() for k, v in inputs.items()}
    for row, n_real in enumerate(inputs["attention_mask"].sum(1).tolist()):
        for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
            pad = 0
            right[key][row] = pad
            right[key][row, :n_real] = inputs[key][row, -n_real:]
    scorer = make_scorer(processor)
    with torch.no_grad():
        torch.testing.assert_close(scorer(**right), scorer(**inputs), atol=1e-5, rtol=1e-4)


def test_from_generator_shares_the_backbone_and_drops_the_lm_head(processor):
    generator = build_tiny_qwen2_5_vl(processor, **TINY_VL)
    scorer = ExpScorer.from_generator(generator)
    assert scorer.backbone is generator.model
    assert not any(name.startswith("lm_head") for name, _ in scorer.named_parameters())
    text_only = build_tiny_qwen2(processor.tokenizer, hidden_size=32, num_attention_heads=2)
    assert ExpScorer.from_generator(text_only).head.in_features == 32
    with pytest.raises(ValueError, match="no inner base model"):
        ExpScorer.from_generator(generator.model)


def test_parameters_to_train(processor):
    scorer = make_scorer(processor)
    assert len(scorer.parameters_to_train(True)) == len(list(scorer.parameters()))
    chosen = {id(p) for p in scorer.parameters_to_train(False)}
    names = {n for n, p in scorer.named_parameters() if id(p) in chosen}
    last = {n for n, _ in scorer.named_parameters() if ".layers.1." in n}
    assert names == {"head.weight", "head.bias", "backbone.language_model.norm.weight"} | last


def test_save_load_round_trip_gives_identical_scores(processor, inputs, tmp_path):
    scorer = make_scorer(processor, seed=3)
    with torch.no_grad():
        before = scorer(**inputs)
    scorer.save_pretrained(tmp_path / "scorer")
    config = json.loads((tmp_path / "scorer" / CONFIG_FILE).read_text())
    assert config == {"format_version": 1, "hidden_size": 32, "attn_implementation": "eager"}
    loaded = ExpScorer.from_pretrained(tmp_path / "scorer")
    assert not loaded.training
    with torch.no_grad():
        after = loaded(**inputs)
    assert before.abs().min() > 0 and before.std() > 0  # a real check, not 0 == 0
    assert torch.equal(before, after)
    for (name, a), (_, b) in zip(
        scorer.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_from_pretrained_rejects_other_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        ExpScorer.from_pretrained(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"format_version": 99}))
    with pytest.raises(ValueError, match="format_version"):
        ExpScorer.from_pretrained(tmp_path)
