"""The experience model: its data (prompts, targets, item splits, preference pairs), the
scorer (a backbone with a scalar head), SFT, pairwise preference fine-tuning with its loss,
scoring items into s_exp, and the text-only ExpModel of the MovieLens chain."""
