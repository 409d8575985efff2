"""The GRPO loop on a real tiny Qwen2: updates, the loss, TAPO credit, KL and the reference.

Rewards that vary within a group (completion length, or the real TAPO text rewards) keep the
advantages non-zero, so every step really moves the weights.
"""

import copy
import math

import pytest
import torch

from creditflow.algorithms import policy_loss
from creditflow.rewards import TRANSLATION_CLOSE, translation_segment_end
from creditflow.training.grpo_runs import grpo_policy
from creditflow.training.rewards import BoundRewards
from tests.training.helpers import make_trainer, spy

TAPO_REWARDS = ["format", "translation", "reasoning"]


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_one_step_changes_every_parameter(make_model, tapo_tokenizer, tapo_prompts):
    model = make_model()
    trainer = make_trainer(model, tapo_tokenizer, tapo_prompts)
    before = _params(model)
    metrics = trainer.step(0)
    assert metrics["adv/abs_mean"] > 0, "length rewards vary within a group"
    assert metrics["actor/grad_norm"] > 0
    unchanged = [k for k, v in model.named_parameters() if torch.equal(v, before[k])]
    assert unchanged == []
    assert metrics["step"] == 1.0
    assert all(math.isfinite(v) for v in metrics.values())
    assert {"reward/total", "reward/length", "actor/loss", "actor/kl", "lr"} <= set(metrics)


@pytest.mark.parametrize(
    ("agg", "beta", "kl", "off_policy"),
    [
        ("seq-mean-token-mean", 0.0, "k3", None),
        ("token-mean", 0.05, "k1", None),
        ("seq-mean-token-sum-norm", 0.1, "k3", None),
        ("seq-mean-token-sum", 0.05, "k3", 0.0),
    ],
)
def test_optimizer_step_loss_and_gradient_are_policy_loss(
    make_model, tapo_tokenizer, tapo_prompts, agg, beta, kl, off_policy
):
    """The engine's loss equals algorithms.policy_loss on the same tensors, and so does its
    gradient (max_grad_norm is large so clipping leaves it alone); the off-policy mask reads
    the sampler's log-probs when the rollout engine reports them."""
    model = make_model()
    trainer = make_trainer(
        model,
        tapo_tokenizer,
        tapo_prompts,
        agg=agg,
        beta=beta,
        kl=kl,
        max_grad_norm=1e9,
        clip_low=0.1,
        clip_high=0.3,
        off_policy_mask_threshold=off_policy,
    )
    torch.manual_seed(0)
    batch = trainer.policy.sample(tapo_prompts[:2], group_size=3)
    g = torch.Generator().manual_seed(1)
    B, T = batch.completion_ids.shape
    advantages = torch.randn(B, T, generator=g) * batch.completion_mask
    weights = torch.rand(B, T, generator=g) * batch.completion_mask
    ref_logp = batch.old_logp + 0.1 * torch.randn(B, T, generator=g) if beta > 0 else None
    # Move the policy off old_logp so the ratios (and the clipping) are not all 1.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))

    twin = copy.deepcopy(model).train()
    logp, _ = grpo_policy(twin, tapo_tokenizer, trainer.config).completion_logprobs(batch)
    expected, expected_metrics = policy_loss(
        logp,
        batch.old_logp,
        advantages,
        batch.completion_mask,
        weights=weights,
        clip_low=0.1,
        clip_high=0.3,
        agg=agg,
        ref_logp=ref_logp,
        beta=beta,
        kl=kl,
        max_len=8,
        off_policy_threshold=off_policy,
        sampling_logp=batch.sampler_logp,
    )
    expected.backward()

    model.train()
    metrics = trainer.optimizer_step(batch, advantages, weights, ref_logp)
    assert metrics["actor/loss"] == pytest.approx(expected.item(), abs=1e-6)
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key
    assert 0 < metrics["actor/clip_frac"] < 1, "the clip is exercised"
    grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in twin.parameters()]))
    assert metrics["actor/grad_norm"] == pytest.approx(grad_norm.item(), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_step_reports_the_policy_loss_of_its_batch(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    """Through step(): the loss it reports is policy_loss of the policy's log-probs on the
    rollout batch, the strategy's advantages and weights, and the config's clip/agg."""
    model = make_model()
    trainer = make_trainer(model, tapo_tokenizer, tapo_prompts, clip_low=0.15, agg="token-mean")
    seen = {}
    update = trainer.update

    def recording_update(step, batch, advantages, weights, ref_logp):
        seen.update(model=copy.deepcopy(model), batch=batch, adv=advantages, w=weights)
        return update(step, batch, advantages, weights, ref_logp)

    monkeypatch.setattr(trainer, "update", recording_update)
    metrics = trainer.step(0)
    batch = seen["batch"]
    logp, _ = grpo_policy(seen["model"], tapo_tokenizer, trainer.config).completion_logprobs(batch)
    # One optimizer step per rollout: the rollout skips its scoring pass and the update uses
    # old_logp = logp.detach() (ratio 1).
    assert batch.old_logp.numel() == 0
    expected, _ = policy_loss(
        logp,
        logp.detach(),
        seen["adv"],
        batch.completion_mask,
        weights=seen["w"],
        clip_low=0.15,
        clip_high=0.2,
        agg="token-mean",
        max_len=8,
    )
    assert metrics["actor/loss"] == pytest.approx(expected.item(), abs=1e-6)
    # grpo + uniform: the advantage is the group zscore of the length on every valid token.
    lengths = torch.tensor([float(len(c)) for c in batch.completion_texts]).view(-1, 4)
    zscore = (lengths - lengths.mean(1, keepdim=True)) / (lengths.std(1, keepdim=True) + 1e-6)
    zscore = torch.nan_to_num(zscore).view(-1, 1)
    torch.testing.assert_close(seen["adv"], zscore * batch.completion_mask, atol=1e-5, rtol=0)
    assert torch.equal(seen["w"], batch.completion_mask)


def test_minibatches_and_iterations(make_model, tapo_tokenizer, tapo_prompts, monkeypatch):
    """B = 2 * 4 = 8, minibatch 4, 2 iterations: 4 optimizer steps of 4 rows per rollout, each
    row used once per iteration; the LR schedule spans steps * 4 optimizer steps."""
    trainer = make_trainer(
        make_model(),
        tapo_tokenizer,
        tapo_prompts,
        minibatch_size=4,
        num_iterations=2,
        steps=3,
        warmup_steps=1,
    )
    calls = spy(monkeypatch, trainer, "optimizer_step")
    trainer.step(0)
    assert [call[0].batch_size for call in calls] == [4, 4, 4, 4]
    rows = [sorted(call[0].completion_texts) for call in calls]
    batch_texts = sorted(rows[0] + rows[1])
    assert sorted(rows[2] + rows[3]) == batch_texts
    assert trainer.optimizer_steps_per_rollout() == 4
    assert trainer.scheduler.last_epoch == 4
    lr_max = trainer.config.learning_rate
    # Cosine after one warm-up step: lr(4) = lr_max * 0.5 * (1 + cos(pi * 3 / 11)).
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(
        lr_max * 0.5 * (1 + math.cos(math.pi * 3 / 11))
    )


def _reference_token_advantages(batch, rewards, tokenizer, alpha: float) -> torch.Tensor:
    """docs/methods/tapo.md by a slow loop: zscores per group, then a token-by-token decode to find the token
    that completes the first </translation>."""
    G = batch.group_size
    out = torch.zeros_like(batch.completion_mask)

    def zscore(r):
        r = r.view(-1, G)
        std = r.std(dim=1, keepdim=True)
        return torch.where(std > 0, (r - r.mean(1, keepdim=True)) / (std + 1e-6), 0.0).view(-1)

    a_trans, a_reason = zscore(rewards["translation"]), zscore(rewards["reasoning"])
    for row, text in enumerate(batch.completion_texts):
        n_valid = int(batch.completion_mask[row].sum())
        ids = batch.completion_ids[row, :n_valid].tolist()
        end = translation_segment_end(text)
        for t in range(n_valid):
            decoded = tokenizer.decode(ids[:t], skip_special_tokens=True)
            in_translation = end is None or len(decoded) < end  # tag not complete before t
            out[row, t] = (
                alpha * a_trans[row] + (1 - alpha) * a_reason[row]
                if in_translation
                else a_reason[row]
            )
    return out


def test_tapo_advantages_follow_the_segment_boundary_in_a_real_rollout(
    make_format_model, tapo_tokenizer, format_prompts, monkeypatch
):
    model = make_format_model()
    rewards_fn = BoundRewards(TAPO_REWARDS, format_prompts, ["5", "5", "3", "8"])
    trainer = make_trainer(
        model,
        tapo_tokenizer,
        format_prompts,
        rewards_fn,
        prompts_per_step=4,
        max_new_tokens=24,
        advantage={"name": "tapo", "alpha": 0.3},
        rewards={"translation": 1.0, "reasoning": 1.0},
    )
    rewards_seen = spy(monkeypatch, trainer, "reward_fn")
    updates = spy(monkeypatch, trainer, "update")
    metrics = trainer.step(0)
    _, batch, advantages, _, _ = updates[0]
    rewards = rewards_fn(*rewards_seen[0])
    closed = [TRANSLATION_CLOSE in text for text in batch.completion_texts]
    assert any(closed) and not all(closed), "the rollout must hold both kinds of completion"
    expected = _reference_token_advantages(batch, rewards, tapo_tokenizer, alpha=0.3)
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)
    assert (advantages[batch.completion_mask == 0] == 0).all(), "padding carries nothing"
    assert 0 < metrics["adv/reasoning_token_frac"] < 1
    assert 0 <= metrics["adv/sign_conflict_rate"] <= 1


def test_completions_without_a_closing_tag_score_zero_and_train(
    make_model, tapo_tokenizer, tapo_tasks, tapo_prompts, monkeypatch
):
    """An untrained policy writes arbitrary text: the real TAPO rewards score a completion with
    no </translation> 0 on format and translation, and the step still updates cleanly."""
    model = make_model()
    rewards_fn = BoundRewards(
        TAPO_REWARDS, list(tapo_tasks["question_en"]), list(tapo_tasks["answer"])
    )
    trainer = make_trainer(
        model,
        tapo_tokenizer,
        tapo_prompts,
        rewards_fn,
        max_new_tokens=12,
        advantage={"name": "tapo", "alpha": 0.5},
        rewards={"translation": 1.0, "reasoning": 1.0, "format": 0.5},
    )
    rewards_seen = spy(monkeypatch, trainer, "reward_fn")
    updates = spy(monkeypatch, trainer, "update")
    metrics = trainer.step(0)
    texts, prompt_index = rewards_seen[0]
    rewards = rewards_fn(texts, prompt_index)
    unclosed = [i for i, text in enumerate(texts) if TRANSLATION_CLOSE not in text]
    assert unclosed, "the untrained policy never closes the tag"
    for name in ("format", "translation"):
        assert (rewards[name][unclosed] == 0).all(), name
    assert all(math.isfinite(v) for v in metrics.values())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # All their tokens are translation segment: one advantage value over each valid row.
    _, batch, advantages, _, _ = updates[0]
    for row in unclosed:
        valid = advantages[row][batch.completion_mask[row].bool()]
        assert torch.equal(valid, valid[:1].expand_as(valid))


def test_kl_reference_is_built_and_used_only_with_beta(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    model = make_model()
    trainer = make_trainer(model, tapo_tokenizer, tapo_prompts, beta=0.1)
    reference = trainer.reference
    assert reference is not None and reference.module is not model
    assert not any(p.requires_grad for p in reference.module.parameters())
    initial = _params(model)
    initial_model = copy.deepcopy(model)
    updates = spy(monkeypatch, trainer, "update")
    metrics = trainer.step(0)
    _, batch, _, _, ref_logp = updates[0]
    assert ref_logp is not None
    # The reference is the initial policy: on the first (on-policy) step its log-probs are the
    # sampling ones and the KL estimate is ~0.
    with torch.no_grad():
        sampling_logp, _ = grpo_policy(
            initial_model, tapo_tokenizer, trainer.config
        ).completion_logprobs(batch)
    valid = batch.completion_mask.bool()
    torch.testing.assert_close(ref_logp[valid], sampling_logp[valid], atol=1e-6, rtol=0)
    assert abs(metrics["actor/kl"]) < 1e-6
    # The policy moved; the frozen reference did not.
    for name, p in reference.module.named_parameters():
        assert torch.equal(p, initial[name]), name
    assert any(not torch.equal(p, initial[k]) for k, p in model.named_parameters())
    assert trainer.step(1)["actor/kl"] > 0

    no_kl = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, beta=0.0)
    assert no_kl.reference is None
    updates = spy(monkeypatch, no_kl, "update")
    assert no_kl.step(0)["actor/kl"] == 0.0
    assert updates[0][4] is None


def test_train_records_history_and_samples(make_model, tapo_tokenizer, tapo_prompts):
    trainer = make_trainer(
        make_model(),
        tapo_tokenizer,
        tapo_prompts,
        steps=3,
        log_samples_every=2,
        samples_per_log=3,
    )
    result = trainer.train()
    assert [row["step"] for row in result.history] == [1.0, 2.0, 3.0]
    assert [s["step"] for s in result.samples] == [1, 1, 1, 3, 3, 3]
    assert all({"prompt_index", "completion", "reward/length"} <= set(s) for s in result.samples)
    assert all(all("/" in k or k in {"step", "lr"} for k in row) for row in result.history)
    lrs = [row["lr"] for row in result.history]
    assert lrs[0] > lrs[1] > lrs[2] == 0.0, "cosine decay to 0 over the 3 optimizer steps"


@pytest.mark.parametrize(
    ("loss_type", "options"),
    # a band from 0: the tiny model's covariances are small, and a token must fall in it
    [("clip_cov", {"ratio": 0.1, "lower": 0.0}), ("kl_cov", {"ratio": 0.1})],
)
def test_a_covariance_control_trains_reproducibly_and_logs_its_share(
    make_model, tapo_tokenizer, tapo_prompts, loss_type, options
):
    # Clip-Cov draws from torch's global stream, which the trainer seeds every step: two runs
    # of one seed are the same run.
    def run():
        model = make_model()
        trainer = make_trainer(
            model, tapo_tokenizer, tapo_prompts, loss_type=loss_type, covariance=options
        )
        history = trainer.train().history
        return history, {k: v.detach().clone() for k, v in model.state_dict().items()}

    history, weights = run()
    again, weights_again = run()
    assert all(h["actor/cov_selected"] > 0 for h in history)
    assert [h["actor/loss"] for h in history] == [h["actor/loss"] for h in again]
    assert all(torch.equal(weights[k], weights_again[k]) for k in weights)
