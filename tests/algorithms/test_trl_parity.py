"""creditflow's ``policy_loss`` against TRL's own ``GRPOTrainer._compute_loss`` (TRL 1.16, the
``bench`` extra), called with a minimal stand-in ``self``: value and gradient w.r.t. the
log-probs, in float64, on random padded batches, for every loss type. The loss settings come
from ``GRPOConfig(loss_type=...)``, so the preset table is checked too. Where the two differ on
purpose (GSPO with per-token advantages or weights: TRL's gradient goes through the sequence
ratio, creditflow's is GSPO-token's) the value is compared and the gradient is checked against
the GSPO-token formula. docs/methods/loss_types.md lists the conventions."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from creditflow.algorithms import policy_loss
from creditflow.training import GRPOConfig

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "gspo", "luspo"]
# creditflow's loss type -> TRL's (loss_type, importance_sampling_level).
TRL_NAMES = {name: (name, "token") for name in LOSS_TYPES} | {
    "gspo": ("grpo", "sequence"),
    "luspo": ("luspo", "sequence"),
}
# The sequence-ratio loss types: with per-token credit their gradient is GSPO-token's.
SEQUENCE_LEVEL = ("gspo", "luspo")
B, T, MAX_LEN = 6, 7, 9
# Tolerance: both sides run in float64 and differ only in summation order.
TOL = {"atol": 1e-10, "rtol": 0.0}


class _OneProcess:
    """The accelerator calls ``_compute_loss`` makes for its metrics, in one process."""

    num_processes = 1

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor


def trl_loss(
    loss_type: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOConfig,
    ref_logp: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's loss of one micro-batch that is the whole generation batch (one process, no
    gradient accumulation, one step per generation) and its gradient w.r.t. ``logp``.
    ``weights`` enter through TRL's vLLM importance-sampling slot, which multiplies the
    policy-gradient term only, as creditflow's token weights do."""
    name, level = TRL_NAMES[loss_type]
    leaf = logp.clone().requires_grad_(True)
    cispo = config.surrogate == "cispo"
    stand_in = SimpleNamespace(
        loss_type=name,
        importance_sampling_level=level,
        beta=config.beta,
        # TRL's cispo reads its cap from epsilon_high, an absolute ratio.
        epsilon_low=0.2 if cispo else config.clip_low,
        epsilon_high=config.cispo_max_ratio if cispo else config.clip_high,
        max_completion_length=config.max_new_tokens,
        args=SimpleNamespace(
            delta=None,
            use_bias_correction_kl=False,
            steps_per_generation=1,
            sapo_temperature_pos=config.sapo_temperature_pos,
            sapo_temperature_neg=config.sapo_temperature_neg,
        ),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=config.off_policy_mask_threshold,
        use_vllm=weights is not None,
        vllm_importance_sampling_correction=weights is not None,
        model=SimpleNamespace(training=True),
        get_off_policy_mask=trl_grpo.GRPOTrainer.get_off_policy_mask,
        current_gradient_accumulation_steps=1,
        accelerator=_OneProcess(),
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (
            leaf,
            torch.zeros_like(leaf),
            None,
        ),
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old_logp,
        "num_items_in_batch": mask.sum(),
    }
    if ref_logp is not None:
        inputs["ref_per_token_logps"] = ref_logp
    if weights is not None:
        inputs["importance_sampling_ratio"] = weights
    loss = trl_grpo.GRPOTrainer._compute_loss(stand_in, None, inputs)
    loss.backward()
    return loss.detach(), leaf.grad


def ours(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOConfig,
    ref_logp: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(
        leaf, old_logp, advantages, mask, weights, ref_logp=ref_logp, **config.loss_options()
    )
    loss.backward()
    return loss.detach(), leaf.grad, metrics


def random_case(loss_type: str, seed: int, per_token: bool = False) -> dict[str, torch.Tensor]:
    """A padded float64 batch: rows of 7, 5, 3, 1 and 0 valid tokens (and one more of 7); the
    log-ratio spread is sized to the loss type's clip range, so some ratios fall inside it
    and some outside (GSPO's range is 3e-4 / 4e-4, CISPO's cap 5, SAPO's gate past half its
    slope at |tau (r - 1)| > 1.76)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 5, 3, 1, 0, 7])
    mask = (torch.arange(T) < lengths.unsqueeze(1)).long()  # (B, T)
    spread = {"gspo": 4e-4, "cispo": 2.0, "sapo": 2.0}.get(loss_type, 0.4)
    old_logp = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    logp = old_logp + spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    shape = (B, T) if per_token else (B,)
    return {
        "logp": logp,
        "old_logp": old_logp,
        "advantages": torch.randn(*shape, generator=g, dtype=torch.float64),
        "mask": mask,
        "ref_logp": old_logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "weights": 0.5 + torch.rand(B, T, generator=g, dtype=torch.float64),
    }


def _config(loss_type: str, beta: float) -> GRPOConfig:
    # TRL builds SAPO's temperatures as a float32 tensor, so its default 1.05 enters as
    # 1.0499999523; a temperature a float32 holds exactly compares the formulas to the last bit
    # (the defaults themselves are held to TRL's below).
    exact = {"sapo_temperature_neg": 1.25} if loss_type == "sapo" else {}
    return GRPOConfig.from_params(
        {"loss_type": loss_type, "beta": beta, "max_new_tokens": MAX_LEN, "group_size": 2} | exact
    )


def test_the_sapo_preset_takes_trls_default_temperatures():
    from creditflow.config.loss_types import LOSS_TYPES  # noqa: PLC0415

    trl_config = pytest.importorskip("trl.trainer.grpo_config")
    fields = trl_config.GRPOConfig.__dataclass_fields__
    preset = LOSS_TYPES["sapo"]
    assert preset.sapo_temperature_pos == fields["sapo_temperature_pos"].default
    assert preset.sapo_temperature_neg == fields["sapo_temperature_neg"].default


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize(
    ("seed", "beta", "with_weights"), [(0, 0.0, False), (1, 0.04, False), (2, 0.0, True)]
)
def test_policy_loss_equals_trl_compute_loss(loss_type, seed, beta, with_weights):
    case = random_case(loss_type, seed)
    config = _config(loss_type, beta)
    args = (case["logp"], case["old_logp"], case["advantages"], case["mask"], config)
    extra = {
        "ref_logp": case["ref_logp"] if beta > 0 else None,
        "weights": case["weights"] if with_weights else None,
    }
    trl_value, trl_grad = trl_loss(loss_type, *args, **extra)
    value, grad, metrics = ours(*args, **extra)
    assert 0 < metrics["actor/clip_frac"] < 1  # the random ratios straddle the clip
    assert_close(value, trl_value, **TOL)
    if loss_type in SEQUENCE_LEVEL and with_weights:
        return  # token weights: GSPO-token's gradient, not TRL's (the last test)
    assert_close(grad, trl_grad, **TOL)
    assert grad.abs().sum() > 0  # not a comparison of two zeros
    assert (grad[case["mask"] == 0] == 0).all()


@pytest.mark.parametrize("loss_type", [name for name in LOSS_TYPES if name not in SEQUENCE_LEVEL])
def test_per_token_advantages_equal_trl(loss_type):
    """TAPO's per-token advantages, and token weights, go through both the same way."""
    case = random_case(loss_type, seed=3, per_token=True)
    config = _config(loss_type, beta=0.04)
    args = (case["logp"], case["old_logp"], case["advantages"], case["mask"], config)
    extra = {"ref_logp": case["ref_logp"], "weights": case["weights"]}
    trl_value, trl_grad = trl_loss(loss_type, *args, **extra)
    value, grad, _ = ours(*args, **extra)
    assert_close(value, trl_value, **TOL)
    assert_close(grad, trl_grad, **TOL)


def test_gspo_with_per_token_credit_has_trls_value_and_the_gspo_token_gradient():
    """With per-token advantages and weights the loss value is TRL's (the sequence ratio
    multiplies each token's own advantage and weight); the gradient is GSPO-token's
    (arXiv 2507.18071, eq. 13-14): on an unclipped token t of row i,
    d loss / d logp_t = -w_t A_t s_i / |o_i| / B under seq-mean-token-mean, where TRL's spreads
    sum_t' w_t' A_t' s_i / |o_i|^2 / B over every token of the row."""
    case = random_case("gspo", seed=4, per_token=True)
    case["logp"] = case["old_logp"] + 1e-4 * (case["logp"] - case["old_logp"]) / 4e-4
    config = _config("gspo", beta=0.0)
    args = (case["logp"], case["old_logp"], case["advantages"], case["mask"], config)
    trl_value, trl_grad = trl_loss("gspo", *args, weights=case["weights"])
    value, grad, metrics = ours(*args, weights=case["weights"])
    assert metrics["actor/clip_frac"] == 0  # every sequence ratio inside the clip range
    assert_close(value, trl_value, **TOL)

    mask = case["mask"].bool()
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)  # (B, 1)
    log_s = torch.where(mask, case["logp"] - case["old_logp"], 0).sum(1, keepdim=True) / lengths
    s = log_s.exp()  # (B, 1), all inside [1 - 3e-4, 1 + 4e-4] at this spread
    assert ((s > 1 - 3e-4) & (s < 1 + 4e-4)).all()
    credit = case["weights"] * case["advantages"]  # (B, T)
    expected = torch.where(mask, -credit * s / lengths / B, 0)
    assert_close(grad, expected, **TOL)
    spread = torch.where(mask, credit, 0).sum(1, keepdim=True) * s / lengths**2 / B
    assert_close(trl_grad, torch.where(mask, -spread, 0), **TOL)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "gspo"])
@pytest.mark.parametrize("per_token", [False, True])
def test_the_off_policy_sequence_mask_equals_trls(loss_type, per_token):
    """TRL's ``off_policy_mask_threshold`` (DeepSeek-V3.2's sequence mask, measured from the
    sampling-time log-probs): the same sequences dropped, the same value and gradient."""
    if loss_type == "gspo" and per_token:
        return  # GSPO with per-token credit: GSPO-token's gradient, not TRL's (tested above)
    case = random_case(loss_type, seed=5, per_token=per_token)
    # A threshold between the sequences' drifts, so some negative-advantage rows are dropped.
    mask = case["mask"].bool()
    drift = torch.where(mask, case["old_logp"] - case["logp"], 0).sum(1) / mask.sum(1).clamp(min=1)
    threshold = float(drift[mask.any(1)].median())
    config = GRPOConfig.from_params(
        {
            "loss_type": loss_type,
            "max_new_tokens": MAX_LEN,
            "group_size": 2,
            "off_policy_mask_threshold": threshold,
        }
    )
    args = (case["logp"], case["old_logp"], case["advantages"], case["mask"], config)
    trl_value, trl_grad = trl_loss(loss_type, *args)
    value, grad, metrics = ours(*args)
    assert 0 < metrics["actor/off_policy_masked"] < 1
    assert_close(value, trl_value, **TOL)
    assert_close(grad, trl_grad, **TOL)
    unmasked, _, _ = ours(*args[:4], _config(loss_type, 0.0))
    assert not torch.isclose(value, unmasked)  # the mask changed the loss
