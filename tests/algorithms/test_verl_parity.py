"""creditflow's Clip-Cov and KL-Cov (``policy_loss`` with ``covariance``) against verl's own
``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov`` (verl 0.9.1): value and
gradient w.r.t. the log-probs, in float64, on random padded batches, with and without token
weights (verl's rollout importance weights, which multiply the per-token loss as creditflow's
token weights do). The loss settings come from ``GRPOConfig(loss_type=...)``, so the presets
are checked too.

verl's package needs Ray and more to import, so the test reads the functions' source from
verl's wheel (``make references`` downloads it into ``.cache/reference``) and runs them
unchanged, with stand-ins for the three names they read from elsewhere (``agg_loss``,
``verl_F.masked_mean`` / ``masked_sum``, taken from the same wheel, and the config classes
they check the type of). Without the wheel the test skips, naming the command."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch
from torch.testing import assert_close

from creditflow.algorithms import policy_loss
from creditflow.training import GRPOConfig

VERL_WHEEL = Path(__file__).resolve().parents[2] / ".cache/reference/verl-0.9.1-py3-none-any.whl"
B, T = 6, 9
TOL = {"atol": 1e-10, "rtol": 0.0}


def _function_source(source: str, names: set[str]) -> str:
    """The top-level functions ``names`` of a module's source, without their decorators
    (verl's registry decorators)."""
    tree = ast.parse(source)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = names - {n.name for n in found}
    if missing:
        raise AssertionError(f"verl's wheel has no {sorted(missing)}: the pinned version moved?")
    for node in found:
        node.decorator_list = []
    return ast.unparse(ast.Module(body=found, type_ignores=[]))


@pytest.fixture(scope="module")
def verl() -> SimpleNamespace:
    if not VERL_WHEEL.is_file():
        pytest.skip(f"verl's wheel is not in {VERL_WHEEL.parent}: run `make references`")
    with zipfile.ZipFile(VERL_WHEEL) as wheel:
        core = wheel.read("verl/trainer/ppo/core_algos.py").decode()
        functional = wheel.read("verl/utils/torch_functional.py").decode()
    helpers: dict[str, Any] = {"torch": torch}
    exec(_function_source(functional, {"masked_sum", "masked_mean"}), helpers)  # noqa: S102
    namespace: dict[str, Any] = {
        "torch": torch,
        "Optional": Optional,
        "Any": Any,
        "ActorConfig": SimpleNamespace,
        "AlgoConfig": type("AlgoConfig", (), {}),
        "verl_F": SimpleNamespace(**{k: helpers[k] for k in ("masked_sum", "masked_mean")}),
    }
    names = {"agg_loss", "compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov"}
    exec(_function_source(core, names), namespace)  # noqa: S102
    return SimpleNamespace(**{name: namespace[name] for name in names})


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 0.05
    old_logp = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    advantages = torch.randn(B, T, generator=g, dtype=torch.float64) * 1.5
    weights = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    return {"logp": logp, "old_logp": old_logp, "adv": advantages, "mask": mask, "w": weights}


def _verl_config(config: GRPOConfig) -> SimpleNamespace:
    control = config.covariance_control()
    return SimpleNamespace(
        clip_ratio=0.2,
        clip_ratio_low=config.clip_low,
        clip_ratio_high=config.clip_high,
        policy_loss=SimpleNamespace(
            clip_cov_ratio=control.ratio,
            clip_cov_lb=control.lower,
            clip_cov_ub=control.upper,
            kl_cov_ratio=control.ratio,
            ppo_kl_coef=control.coef,
        ),
        global_batch_info={},
    )


def _value_and_grad(loss_fn, logp: torch.Tensor, draw_seed: int):
    leaf = logp.clone().requires_grad_(True)
    torch.manual_seed(draw_seed)  # Clip-Cov's draw: torch's global stream on both sides
    loss = loss_fn(leaf)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


CASES = [
    ("clip_cov", {"ratio": 0.2}),
    ("clip_cov", {"ratio": 0.05, "lower": 0.2, "upper": 3.0}),
    ("kl_cov", {"ratio": 0.2}),
    ("kl_cov", {"ratio": 0.1, "coef": 0.3}),
]


@pytest.mark.parametrize("with_weights", [False, True])
@pytest.mark.parametrize(("loss_type", "options"), CASES)
@pytest.mark.parametrize("seed", range(4))
def test_policy_loss_equals_verls_covariance_losses(verl, loss_type, options, seed, with_weights):
    config = GRPOConfig(loss_type=loss_type, covariance=options)
    assert config.agg == "token-mean"  # verl's default loss_agg_mode
    b = _batch(seed)
    weights = b["w"] if with_weights else None
    reference = {
        "clip_cov": verl.compute_policy_loss_clip_cov,
        "kl_cov": verl.compute_policy_loss_kl_cov,
    }[loss_type]
    theirs, their_grad = _value_and_grad(
        lambda logp: reference(
            b["old_logp"],
            logp,
            b["adv"],
            b["mask"],
            loss_agg_mode="token-mean",
            config=_verl_config(config),
            rollout_is_weights=weights,
        )[0],
        b["logp"],
        draw_seed=seed,
    )
    metrics = {}

    def ours_fn(logp):
        loss, found = policy_loss(
            logp, b["old_logp"], b["adv"], b["mask"], weights=weights, **config.loss_options()
        )
        metrics.update(found)
        return loss

    ours, our_grad = _value_and_grad(ours_fn, b["logp"], draw_seed=seed)
    assert_close(ours, theirs, **TOL)
    assert_close(our_grad, their_grad, **TOL)
    # The control acted: some token was selected, so the comparison was not of two plain losses.
    assert metrics["actor/cov_selected"] > 0


def test_the_selection_changes_the_loss():
    # Against the same surrogate without the control, the selected tokens change the gradient
    # (so the parity above could fail), and only there.
    b = _batch(0)
    config = GRPOConfig(loss_type="kl_cov", covariance={"ratio": 0.2})
    plain = {k: v for k, v in config.loss_options().items() if "cov" not in k}
    _, with_control = _value_and_grad(
        lambda logp: policy_loss(logp, b["old_logp"], b["adv"], b["mask"], **config.loss_options())[
            0
        ],
        b["logp"],
        draw_seed=0,
    )
    _, without = _value_and_grad(
        lambda logp: policy_loss(logp, b["old_logp"], b["adv"], b["mask"], **plain)[0],
        b["logp"],
        draw_seed=0,
    )
    changed = (with_control - without).abs() > 1e-12
    assert changed.any() and not changed[b["mask"] == 0].any()


def test_kl_cov_is_the_unclipped_loss_in_an_on_policy_update():
    # Its penalty |logp - old_logp| is 0 at the sampling policy, and so is its gradient there:
    # with one optimizer step per rollout KL-Cov trains exactly as the unclipped surrogate.
    b = _batch(1)
    config = GRPOConfig(loss_type="kl_cov", covariance={"ratio": 0.5})
    plain = {k: v for k, v in config.loss_options().items() if "cov" not in k}
    args = (b["adv"], b["mask"])
    with_control = _value_and_grad(
        lambda logp: policy_loss(logp, logp.detach(), *args, **config.loss_options())[0],
        b["logp"],
        draw_seed=0,
    )
    without = _value_and_grad(
        lambda logp: policy_loss(logp, logp.detach(), *args, **plain)[0], b["logp"], draw_seed=0
    )
    assert_close(with_control[0], without[0], **TOL)
    assert_close(with_control[1], without[1], **TOL)
