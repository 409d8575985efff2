"""The experience chain: annotated items -> ExpModel (SFT, then pairwise PFT) -> experience
scores s_exp -> the reranker's augmented targets and page-level GRPO -> the simulated A/B
(docs/methods/experience.md).

Sub-packages in the order a reader meets them: ``world`` (the simulated catalogue and search
logs, the MovieLens sessions, a researcher's own items and impressions), ``annotation`` (the
item annotators, their cache, credentials and schema), ``expmodel`` (ExpModel data, SFT, PFT
and its pairwise loss, scoring), ``reranker`` (the pointer reranker, y_aug targets,
pre-training, the page reward and page GRPO), ``clicks`` (the click model fitted from logs
and the page feedback it predicts) and ``ab_test`` (the simulated A/B, the controls and the
report). ``config`` holds the chain's typed reranker settings, without torch, so the
parameter check reads it before torch loads.

Built on the engine (``creditflow.training``), which never imports it. This file imports
nothing, so reading ``chain.config`` loads none of the chain's torch modules.
"""
