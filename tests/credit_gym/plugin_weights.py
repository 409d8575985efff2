"""A tiny strategy of one's own for the gym's plugin test: weight 1 on the second half of
every completion, 0 on the first (a plain function of the token-weight signature)."""

import torch


def second_half(spec, batch, policy, context):
    weights = torch.zeros_like(batch.completion_mask)
    weights[:, batch.completion_mask.shape[1] // 2 :] = 1.0
    return weights * batch.completion_mask
