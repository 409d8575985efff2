"""The frozen ViT's kept outputs: the same log-probs, gradients and samples as running the ViT
in every forward, bit for bit, and dropped when a ViT weight changes."""

import pytest
import torch

from creditflow.algorithms import masked_mean
from creditflow.models import freeze_vision_encoder
from creditflow.rollout import SamplingSettings, VisionLanguagePolicy
from creditflow.rollout.backends.lean import LeanBackend
from creditflow.rollout.vision_cache import FrozenVisionFeatures, vit_states
from creditflow.training.teacher_forcing import target_batch


def _policy(model, processor, cache: bool, **sampling) -> VisionLanguagePolicy:
    backend = sampling.pop("backend", None)
    return VisionLanguagePolicy(
        model,
        processor,
        SamplingSettings(**{"max_new_tokens": 8, **sampling}),
        backend=backend,
        vision_cache_bytes=2**30 if cache else 0,
    )


# Batches with repeats inside one batch, images kept from an earlier batch beside new ones,
# and the wide picture (another grid: the ViT's window reordering is not the identity).
BATCHES = [[0, 1, 2, 0], [3, 1, 3, 2], [2, 0, 3]]


def _losses_and_grads(policy, prompts, targets):
    model = policy.module
    out = []
    for rows in BATCHES:
        batch = target_batch(policy, [prompts[i] for i in rows], [targets[i] for i in rows])
        logp, _ = policy.completion_logprobs(batch)
        model.zero_grad()
        (-masked_mean(logp, batch.completion_mask)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out.append((logp.detach(), grads))
    return out


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_kept_vit_outputs_give_the_same_logprobs_and_gradients(
    make_vl_model, vl_processor, vl_prompts, shared_prefix
):
    targets = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14]]
    results = {}
    for cache in (False, True):
        policy = _policy(
            freeze_vision_encoder(make_vl_model()), vl_processor, cache, shared_prefix=shared_prefix
        )
        results[cache] = _losses_and_grads(policy, vl_prompts, targets)
        features = policy.vision_features
        assert features.applies() is cache
    assert features.misses == 4 and features.hits > 0  # each picture through the ViT once
    for (logp, grads), (logp_kept, grads_kept) in zip(results[False], results[True], strict=True):
        assert torch.equal(logp, logp_kept)
        assert grads.keys() == grads_kept.keys()
        assert any(".merger." in name for name in grads)  # the merger still trains
        for name, grad in grads.items():
            assert torch.equal(grad, grads_kept[name]), name


def test_lean_samples_are_the_same_with_kept_vit_outputs(make_vl_model, vl_processor, vl_prompts):
    drawn = {}
    for cache in (False, True):
        policy = _policy(
            freeze_vision_encoder(make_vl_model()), vl_processor, cache, backend=LeanBackend()
        )
        runs = []
        for _ in range(2):  # the second run reads every picture from the cache
            torch.manual_seed(0)
            batch = policy.sample(vl_prompts, group_size=2, with_entropy=True)
            runs.append((batch.completion_ids, batch.old_logp, batch.entropy))
        drawn[cache] = runs
    for plain, kept in zip(drawn[False], drawn[True], strict=True):
        for a, b in zip(plain, kept, strict=True):
            assert torch.equal(a, b)


def test_vit_states_through_the_merger_are_the_models_image_features(
    make_vl_model, vl_processor, vl_prompts
):
    model = freeze_vision_encoder(make_vl_model())
    inputs = _policy(model, vl_processor, cache=False).encode_prompts(vl_prompts)
    counts = inputs["image_grid_thw"].prod(-1).tolist()
    pixels = torch.cat([inputs["pixel_values"][b, :n] for b, n in enumerate(counts)])
    with torch.no_grad():
        expected = model.model.get_image_features(pixels, inputs["image_grid_thw"]).pooler_output
        visual = model.model.visual
        states = vit_states(visual, pixels, inputs["image_grid_thw"])
        merged = [visual.merger(state)[order] for state, order in states]
    assert [state.shape[0] for state, _ in states] == counts
    for a, b in zip(expected, merged, strict=True):
        assert torch.equal(a, b)


def test_a_changed_vit_weight_drops_the_kept_outputs(make_vl_model, vl_processor, vl_prompts):
    model = freeze_vision_encoder(make_vl_model())
    policy = _policy(model, vl_processor, cache=True)
    batch = target_batch(policy, vl_prompts[:2], [[5, 6], [7]])
    with torch.no_grad():
        policy.completion_logprobs(batch)
        assert len(policy.vision_features) == 2
        model.model.visual.blocks[0].mlp.up_proj.weight.mul_(2.0)  # as load_state_dict would
        changed, _ = policy.completion_logprobs(batch)
        reference, _ = _policy(model, vl_processor, cache=False).completion_logprobs(batch)
    assert policy.vision_features.misses == 4  # both pictures through the ViT again
    assert torch.equal(changed, reference)


def test_the_cache_stays_out_of_a_trained_vit_and_keeps_to_its_budget(
    make_vl_model, vl_processor, vl_prompts
):
    trained = FrozenVisionFeatures(make_vl_model())  # every ViT weight requires grad
    assert not trained.applies()
    model = freeze_vision_encoder(make_vl_model())
    assert not FrozenVisionFeatures(model, max_bytes=0).applies()
    # Room for one 64-patch picture's states (and its 16 merged rows' order): the least
    # recently used one goes.
    hidden = model.config.vision_config.hidden_size
    features = FrozenVisionFeatures(model, max_bytes=64 * hidden * 4 + 16 * 8)
    policy = _policy(model, vl_processor, cache=True)
    policy.vision_features = features
    with torch.no_grad():
        for prompts in ([vl_prompts[0]], [vl_prompts[1]], [vl_prompts[1]]):
            policy.completion_logprobs(target_batch(policy, prompts, [[5, 6]]))
    assert len(features) == 1 and (features.misses, features.hits) == (2, 1)
    with features.installed():  # the model's own method is back after each forward
        assert "get_image_features" in vars(features.owner)
    assert "get_image_features" not in vars(features.owner)


def test_states_kept_under_bf16_autocast_are_not_served_without_it(
    make_vl_model, vl_processor, vl_prompts
):
    model = freeze_vision_encoder(make_vl_model())
    policy = _policy(model, vl_processor, cache=True)
    batch = target_batch(policy, vl_prompts[:2], [[5, 6], [7]])
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            policy.completion_logprobs(batch)
        assert policy.vision_features.misses == 2
        full_precision, _ = policy.completion_logprobs(batch)
        reference, _ = _policy(model, vl_processor, cache=False).completion_logprobs(batch)
    assert policy.vision_features.misses == 4  # through the ViT again, in float32
    assert torch.equal(full_precision, reference)
