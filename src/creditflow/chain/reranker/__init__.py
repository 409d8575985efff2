"""The reranker: the pointer-network model, sessions and y_aug targets, nDCG and rank gains,
pre-training, the sampling policy, the page reward (alpha * R_old + beta * nDCG@K) and
page-level GRPO."""
