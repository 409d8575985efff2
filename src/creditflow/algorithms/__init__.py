"""Pure tensor algorithms of creditflow: advantages, ToR token weights, losses (with Clip-Cov
and KL-Cov), HICRA's amplification, DAPO's overlong penalty and group filter.

No Kedro, no I/O: tensors in, a tensor or ``(tensor, metrics)`` out. Shape symbols:
``B`` sequences, ``G`` group size, ``T`` tokens, ``V`` vocabulary.
"""

from creditflow.algorithms._masked import masked_mean
from creditflow.algorithms.advantages import (
    decoupled_group_advantages,
    group_zscore,
    segment_token_advantages,
    shuffle_group_advantages,
    sign_conflict_rate,
    tapo_advantages,
)
from creditflow.algorithms.covariance import (
    COVARIANCE_CONTROLS,
    clip_cov_keep,
    kl_cov_selected,
    token_covariance,
)
from creditflow.algorithms.dapo import constant_groups, overlong_penalty
from creditflow.algorithms.hicra import entropy_threshold, hicra_advantages, strategic_gram_mask
from creditflow.algorithms.logprobs import token_logprobs
from creditflow.algorithms.losses import (
    AGGREGATIONS,
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    SURROGATES,
    SurrogateKnobs,
    kl_penalty,
    micro_batch_share,
    policy_loss,
    sampler_mismatch,
    truncated_importance_weights,
)
from creditflow.algorithms.tor import (
    OVERLAP_MODES,
    num_selected,
    top_fraction_mask,
    top_fraction_threshold,
    topp_entropy,
    tor_token_weights,
    tor_weights_from_selection,
    visual_sensitivity,
)
from creditflow.algorithms.vppo import (
    top_share_per_row,
    trajectory_scale,
    visual_dependency,
    vppo_weights,
)

__all__ = [
    "top_share_per_row",
    "trajectory_scale",
    "visual_dependency",
    "vppo_weights",
    "COVARIANCE_CONTROLS",
    "clip_cov_keep",
    "entropy_threshold",
    "hicra_advantages",
    "kl_cov_selected",
    "strategic_gram_mask",
    "token_covariance",
    "decoupled_group_advantages",
    "AGGREGATIONS",
    "IMPORTANCE_LEVELS",
    "KL_ESTIMATORS",
    "OVERLAP_MODES",
    "SURROGATES",
    "SurrogateKnobs",
    "constant_groups",
    "group_zscore",
    "kl_penalty",
    "masked_mean",
    "micro_batch_share",
    "overlong_penalty",
    "num_selected",
    "policy_loss",
    "sampler_mismatch",
    "segment_token_advantages",
    "shuffle_group_advantages",
    "sign_conflict_rate",
    "tapo_advantages",
    "token_logprobs",
    "top_fraction_mask",
    "top_fraction_threshold",
    "topp_entropy",
    "tor_token_weights",
    "tor_weights_from_selection",
    "truncated_importance_weights",
    "visual_sensitivity",
]
