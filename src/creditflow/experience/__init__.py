"""The experience chain: annotated items -> ExpModel (SFT, then pairwise PFT) -> experience
scores s_exp -> the reranker's augmented targets and page-level GRPO -> the simulated A/B.

Modules in the order a reader meets them: ``expmodel_data`` (prompts, targets, item splits,
preference pairs), ``expmodel_sft``, ``expmodel_pft``, ``expmodel_scoring``, ``text_expmodel``
(the text-only ExpModel of the MovieLens chain), ``reranker_data`` (sessions, y_aug),
``reranker_training`` (pre-training), ``reranker_policy`` (sampling pages), ``page_reward``
(alpha * R_old + beta * nDCG@K), ``page_grpo``, ``simulated_ab``, ``controls`` (what s_exp
itself adds: the controls' contrasts) and ``reporting``.
Built on the engine (``creditflow.training``), which never imports it.
"""
