"""``GRPOConfig.loss_type`` presets (config.loss_types) and the DAPO options' checks: what
each preset sets, that explicit knobs override its defaults, and that a contradiction fails
before any model is built, naming the key to drop."""

import pytest

from creditflow.config.grpo import check_process_layout
from creditflow.config.loss_types import DEFAULTED, DEFINING, LOSS_TYPES
from creditflow.errors import ConfigError
from creditflow.training import GRPOConfig
from creditflow.training.grpo_runs import build_grpo_config, check_distributed, strategy_config

REWARDS = ["format", "translation", "reasoning"]
BASE = {"prompts_per_step": 4, "group_size": 4, "rewards": {"reasoning": 1.0}}


def config(**params) -> GRPOConfig:
    return build_grpo_config({**BASE, **params}, REWARDS)


def test_no_loss_type_is_todays_loss():
    """The default config passes policy_loss exactly the keyword arguments it always did."""
    assert config().loss_options() == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "agg": "seq-mean-token-mean",
        "beta": 0.0,
        "kl": "k3",
        "max_len": 64,
        "importance_level": "token",
        "surrogate": "clip",
    }
    assert config().advantage == {"name": "grpo"}
    assert GRPOConfig().loss_options() == config().loss_options()


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        ("grpo", {"agg": "seq-mean-token-mean", "clip_low": 0.2, "clip_high": 0.2}),
        ("bnpo", {"agg": "token-mean", "clip_low": 0.2, "clip_high": 0.2}),
        ("dr_grpo", {"agg": "seq-mean-token-sum-norm", "clip_low": 0.2, "clip_high": 0.2}),
        ("dapo", {"agg": "token-mean", "clip_low": 0.2, "clip_high": 0.28}),
        ("cispo", {"agg": "token-mean", "surrogate": "cispo", "max_ratio": 5.0}),
        (
            "gspo",
            {"importance_level": "sequence", "clip_low": 3e-4, "clip_high": 4e-4},
        ),
        (
            "luspo",
            {"agg": "seq-mean-token-sum", "importance_level": "sequence", "clip_low": 0.2},
        ),
    ],
)
def test_each_loss_type_sets_its_knobs(loss_type, expected):
    options = config(loss_type=loss_type).loss_options()
    assert {key: options[key] for key in expected} == expected
    assert ("max_ratio" in options) == (loss_type == "cispo")
    assert ("clip_low" in options) == (loss_type != "cispo")


def test_the_table_holds_only_knobs_the_config_has():
    for name, preset in LOSS_TYPES.items():
        assert preset.source, name
        for key in (*DEFINING, *DEFAULTED):
            assert hasattr(GRPOConfig(), key)


def test_dr_grpo_reaches_the_advantage_spec_of_every_strategy():
    assert config(loss_type="dr_grpo").advantage == {"name": "grpo", "scale_by_std": False}
    tapo = config(
        loss_type="dr_grpo",
        advantage={"name": "tapo", "alpha": 0.7},
        rewards={"translation": 1.0, "reasoning": 1.0},
    )
    assert tapo.advantage == {"name": "tapo", "alpha": 0.7, "scale_by_std": False}
    # An explicit setting that agrees is fine.
    agreeing = config(loss_type="dr_grpo", advantage={"name": "grpo", "scale_by_std": False})
    assert agreeing.advantage["scale_by_std"] is False
    # Other loss types leave the spec alone.
    assert config(loss_type="dapo", advantage={"name": "grpo", "scale_by_std": True}).advantage[
        "scale_by_std"
    ]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"loss_type": "dr_grpo", "agg": "token-mean"}, "drop agg"),
        ({"loss_type": "grpo", "importance_level": "sequence"}, "drop importance_level"),
        ({"loss_type": "gspo", "surrogate": "cispo"}, "drop surrogate"),
        (
            {"loss_type": "dr_grpo", "advantage": {"name": "grpo", "scale_by_std": True}},
            "drop advantage.scale_by_std",
        ),
        ({"loss_type": "cispo", "clip_high": 0.28}, "clip_high is not read by surrogate 'cispo'"),
        ({"surrogate": "cispo", "clip_low": 0.1}, "drop clip_low"),
        ({"cispo_max_ratio": 4.0}, "cispo_max_ratio is not read by surrogate 'clip'"),
        ({"loss_type": "ppo"}, r"unknown loss_type 'ppo'; valid: \['bnpo', 'cispo', 'clip_cov'"),
        ({"importance_level": "sentence"}, "importance_level must be one of"),
        ({"surrogate": "reinforce"}, "surrogate must be one of"),
        ({"loss_type": "cispo", "cispo_max_ratio": 0.0}, "cispo_max_ratio must be > 0"),
    ],
)
def test_contradictions_fail_naming_the_key_to_drop(params, message):
    with pytest.raises(ConfigError, match=message):
        config(**params)


def test_explicit_knobs_override_a_presets_defaults_and_agreeing_ones_are_fine():
    dapo = config(loss_type="dapo", clip_high=0.3).loss_options()
    assert (dapo["agg"], dapo["clip_low"], dapo["clip_high"]) == ("token-mean", 0.2, 0.3)
    assert config(loss_type="cispo", cispo_max_ratio=2.0).loss_options()["max_ratio"] == 2.0
    assert config(loss_type="dr_grpo", agg="seq-mean-token-sum-norm").agg == (
        "seq-mean-token-sum-norm"
    )
    # Without a loss type the knobs combine freely: GSPO's ratio with DAPO's aggregation.
    free = config(importance_level="sequence", agg="token-mean").loss_options()
    assert (free["importance_level"], free["agg"]) == ("sequence", "token-mean")
    assert config(surrogate="cispo").loss_options()["max_ratio"] == 5.0


def test_a_strategys_overrides_meet_the_loss_type_of_the_shared_block():
    """A strategy of a comparison sets its own knobs over tapo.grpo's loss_type: the same
    rules apply to the merged config."""
    params = {"grpo": {**BASE, "loss_type": "dapo"}, "reward_functions": REWARDS}
    cfg, _ = strategy_config(params, {"clip_high": 0.25})
    assert (cfg.agg, cfg.clip_high) == ("token-mean", 0.25)
    with pytest.raises(ConfigError, match="drop agg"):
        strategy_config(params, {"agg": "seq-mean-token-mean"})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"overlong": {"buffer": 0}}, r"overlong.buffer must be in \[1, max_new_tokens = 64\]"),
        ({"overlong": {"buffer": 65}}, "overlong.buffer"),
        ({"overlong": {"buffer": 8, "penalty_factor": -1.0}}, "penalty_factor must be >= 0"),
        ({"overlong": {"penalty_factor": 1.0}}, "`overlong.buffer` is required"),
        ({"overlong": {"buffer": 8, "cache": 2}}, r"unknown overlong option\(s\) \['cache'\]"),
        ({"overlong": {"buffer": "8"}}, "`overlong.buffer` must be int"),
        ({"overlong": {"buffer": 8, "reward": "length"}}, "overlong.reward 'length' is not comp"),
        ({"overlong": {"buffer": 8, "reward": "format"}}, "neither weighted in rewards nor read"),
        ({"dynamic_sampling": {"reward": "chrf"}}, "dynamic_sampling.reward 'chrf' is not comp"),
        ({"dynamic_sampling": {"max_extra_rollouts": -1}}, "max_extra_rollouts must be >= 0"),
        ({"dynamic_sampling": {"cap": 3}}, r"unknown dynamic_sampling option\(s\) \['cap'\]"),
        ({"dynamic_sampling": "on"}, "`dynamic_sampling` must be dict or null"),
    ],
)
def test_bad_dapo_options_fail_before_training(params, message):
    with pytest.raises(ConfigError, match=message):
        config(**params)


def test_dapo_options_are_read_with_their_defaults():
    cfg = config(overlong={"buffer": 8}, dynamic_sampling={}, mask_truncated_completions=True)
    overlong = cfg.overlong_shaping()
    assert (overlong.buffer, overlong.penalty_factor, overlong.reward) == (8, 1.0, "reasoning")
    sampling = cfg.dynamic_sampling_spec()
    # The cap defaults to one more rollout batch: prompts_per_step * group_size = 16.
    assert (sampling.reward, sampling.success, sampling.max_extra_rollouts) == (
        "reasoning",
        1.0,
        16,
    )
    # The TAPO strategy reads the reasoning reward itself: shaping it reaches its advantages.
    config(
        overlong={"buffer": 8, "reward": "translation"},
        advantage={"name": "tapo"},
        rewards={"reasoning": 1.0},
    )


def test_dynamic_sampling_runs_in_one_process():
    cfg = config(dynamic_sampling={})
    check_process_layout(cfg, 1)
    with pytest.raises(ConfigError, match="dynamic_sampling runs in a single process"):
        check_process_layout(cfg, 2)
    with pytest.raises(ConfigError, match="dynamic_sampling runs in a single process"):
        check_distributed({"num_processes": 2}, cfg)


def test_the_off_policy_mask_reaches_the_loss_and_a_negative_threshold_is_refused():
    assert "off_policy_threshold" not in config().loss_options()
    assert config(off_policy_mask_threshold=0.5).loss_options()["off_policy_threshold"] == 0.5
    with pytest.raises(ConfigError, match="off_policy_mask_threshold must be >= 0"):
        config(off_policy_mask_threshold=-0.1)


def test_the_covariance_presets_name_their_control_and_refuse_what_they_do_not_read():
    clip = config(loss_type="clip_cov").loss_options()
    assert (clip["covariance"], clip["surrogate"], clip["agg"]) == (
        "clip_cov",
        "clip",
        "token-mean",
    )
    assert (clip["covariance_ratio"], clip["clip_cov_lower"], clip["clip_cov_upper"]) == (
        2e-4,
        1.0,
        5.0,
    )
    kl = config(loss_type="kl_cov", covariance={"ratio": 0.01, "coef": 0.5}).loss_options()
    assert (kl["covariance"], kl["surrogate"], kl["kl_cov_coef"]) == ("kl_cov", "unclipped", 0.5)
    assert "clip_low" not in kl  # the unclipped surrogate reads no clip range
    # Any loss type takes the control by name; without one there is none.
    assert config(covariance={"name": "kl_cov"}).loss_options()["surrogate"] == "clip"
    assert "covariance" not in config().loss_options()
    refused = [
        ({"loss_type": "kl_cov", "covariance": {"name": "clip_cov"}}, "drop covariance.name"),
        ({"loss_type": "kl_cov", "clip_high": 0.28}, "clip_high is not read by surrogate"),
        ({"covariance": {"name": "clip_cov", "coef": 2.0}}, r"\['coef'\] not read by clip_cov"),
        ({"covariance": {"name": "kl_cov", "upper": 2.0}}, r"\['upper'\] not read by kl_cov"),
        ({"covariance": {"name": "clip_cov", "lower": 5.0}}, "must be below covariance.upper"),
        ({"covariance": {"name": "clip_cov", "ratio": 0.0}}, r"ratio must be in \(0, 1\]"),
        ({"covariance": {"name": "top_cov"}}, "covariance.name must be one of"),
        ({"covariance": {"ratio": 0.1}}, "name"),
        ({"covariance": {"name": "kl_cov", "rate": 0.1}}, "unknown covariance option"),
    ]
    for params, message in refused:
        with pytest.raises(ConfigError, match=message):
            config(**params)
