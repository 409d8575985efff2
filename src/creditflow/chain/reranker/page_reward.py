"""Page-level GRPO (docs/methods/experience.md, step 5): the engine's ``grpo`` advantage on the page reward
``alpha * R_old + beta * nDCG@k(y, y^s)``, with pages sampled by the ``RerankerPolicy``.
``R_old`` is the business objective, clicks + long views of the sampled page. Where it comes
from is ``reranker_grpo.reward.r_old`` (``R_OLD_SOURCES``):

- ``fitted_click_model`` (the default): the expected clicks + long views of the page under a
  click model fitted to the training logs (``chain.clicks.logged``), reading only what a
  production system has: positions, popularity, category match, title signals, where its
  ranker listed an item before, and each item's and query-item pair's own clicks; pessimistic
  (``pessimism``: a lower confidence bound) where those clicks are few.
- ``oracle_expected``: the exact expectation under the simulator's own ``ClickModel``, which
  reads the hidden quality, click-bait and relevance: the reward then knows the answer the
  A/B scores, noise-free. A ceiling, never a method's result.
- ``online_sampled``: one simulated user (the same ``ClickModel``) per sampled page, like
  learning from live traffic, within a counted budget of users (``online_user_budget``).
- ``logged_clicks``: nDCG of the clicks logged under the old order (counterfactual).

Nothing in the loop is specific to pages: the method is this reward and the config it runs
under (one ``"page"`` reward, one pointer step per candidate). ``page_grpo.run_page_grpo``
puts them together with the reranker policy.

Shape symbols: ``N`` sessions, ``B`` sampled pages, ``L`` candidates per session.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch

from creditflow.chain.clicks.feedback import (
    best_page_value,
    expected_page_feedback,
    sample_page_feedback,
)
from creditflow.chain.clicks.logged import (
    LoggedClickModel,
    fitted_response,
    has_truth,
    observable,
)
from creditflow.chain.config import (
    FITTED,
    GAIN_MODES,
    ONLINE_SAMPLED,
    ORACLE_EXPECTED,
    R_OLD_SOURCES,
)
from creditflow.chain.reranker.policy import parse_rankings
from creditflow.chain.reranker.ranking import ndcg_at_k, rank_gains
from creditflow.chain.reranker.training import logged_sessions
from creditflow.chain.world.catalogue import ClickModel, candidate_response
from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError

FEEDBACK_MODES = ("expected", "sampled")
# Sources that show pages to the simulator's users (its ClickModel reads the hidden truth).
SIMULATED_SOURCES = {ORACLE_EXPECTED: "expected", ONLINE_SAMPLED: "sampled"}


class LoggedClicks:
    """``R_old`` of docs/methods/experience.md, step 5 as first written: nDCG@k of the clicks logged under the old order.
    Counterfactual: an item the old page never exposed has no click, so it never scores.

    Args:
        clicks: ``(N, L)`` logged 0/1 clicks per candidate.
        k: nDCG cut-off (>= 1).
    """

    def __init__(self, clicks: torch.Tensor, k: int):
        check_ndim_2("clicks", clicks)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.clicks, self.k = clicks.float(), int(k)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.clicks.shape)

    def run_key(self) -> tuple[list[torch.Tensor], list[object]]:
        return [self.clicks], ["logged_clicks", self.k]

    def __call__(
        self, rankings: torch.Tensor, rows: torch.Tensor, completions: list[str]
    ) -> dict[str, torch.Tensor]:
        gains = self.clicks[rows]  # (B, L)
        return {"r_old": ndcg_at_k(gains.gather(1, rankings), self.k, ideal_gains=gains)}


def _page_value(
    rankings: torch.Tensor,
    click: torch.Tensor,
    long_view: torch.Tensor,
    position_weights: torch.Tensor,
    long_view_weight: float,
    best: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """``{"r_old", "clicks", "long_views"}`` ``(B,)`` of pages ``rankings`` ``(B, L)`` in
    expectation: ``(clicks + long_view_weight * long_views) / best``."""
    clicks, long_views = expected_page_feedback(rankings, click, long_view, position_weights)
    clicks, long_views = clicks.sum(-1), long_views.sum(-1)  # (B,)
    value = (clicks + long_view_weight * long_views) / best
    return {"r_old": value.float(), "clicks": clicks.float(), "long_views": long_views.float()}


class FittedClickFeedback:
    """``R_old`` = clicks + long views of the sampled page as a click model fitted to the
    training logs expects them (``chain.clicks.logged``): what the logs can teach,
    nothing the simulator hides.

    ``R_old(y) = (clicks(y) + long_view_weight * long_views(y)) / best`` with
    ``clicks(y) = sum_p w_p * a[y[p]]`` and ``long_views(y) = sum_p w_p * a[y[p]] * l[y[p]]``
    under the fitted position weights ``w``, attractiveness ``a`` and long-view probability
    ``l``; ``best`` is the same model's best page of the session, so ``R_old`` is in [0, 1].

    Args:
        attractiveness: ``(N, L)`` fitted ``P(click | shown at the top)`` per candidate.
        long_view_probability: ``(N, L)`` fitted ``P(long view | click)`` per candidate.
        position_weights: ``(L,)`` fitted exposure x examination, non-increasing.
        long_view_weight: weight of a long view against a click (>= 0).
    """

    def __init__(
        self,
        attractiveness: torch.Tensor,
        long_view_probability: torch.Tensor,
        position_weights: torch.Tensor,
        long_view_weight: float = 1.0,
    ):
        check_ndim_2("attractiveness", attractiveness)
        if attractiveness.shape != long_view_probability.shape:
            raise ValueError("attractiveness and long_view_probability must match, (N, L)")
        if tuple(position_weights.shape) != (attractiveness.shape[1],):
            raise ValueError(
                f"position_weights must have shape (L,) = ({attractiveness.shape[1]},)"
            )
        if not (math.isfinite(long_view_weight) and long_view_weight >= 0):
            raise ValueError(f"long_view_weight must be finite and >= 0, got {long_view_weight}")
        self.click = attractiveness.double()
        self.long_view = long_view_probability.double()
        self.position_weights = position_weights.double()
        self.long_view_weight = float(long_view_weight)
        values = self.click * (1.0 + self.long_view_weight * self.long_view)  # (N, L)
        self.best = best_page_value(values, self.position_weights).clamp(min=1e-12)  # (N,)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.click.shape)

    def run_key(self) -> tuple[list[torch.Tensor], list[object]]:
        tensors = [self.click, self.long_view, self.position_weights]
        return tensors, [FITTED, self.long_view_weight]

    def __call__(
        self, rankings: torch.Tensor, rows: torch.Tensor, completions: list[str]
    ) -> dict[str, torch.Tensor]:
        return _page_value(
            rankings,
            self.click[rows],
            self.long_view[rows],
            self.position_weights,
            self.long_view_weight,
            self.best[rows],
        )


class SimulatedFeedback:
    """``R_old`` = the business objective of the paper, clicks + long views, as the simulated
    users (the world's ``ClickModel``) give it to the sampled page itself: the
    ``oracle_expected`` and ``online_sampled`` sources. The ``ClickModel`` reads the hidden
    quality, click-bait and relevance, so with ``mode="expected"`` the reward is the A/B's own
    scoring function, noise-free.

    ``R_old(y) = (clicks(y) + long_view_weight * long_views(y)) / best``, where ``best`` is the
    expected value of the best page of that session (candidates by
    ``c * (1 + long_view_weight * l)``, ``chain.clicks.feedback.best_page_value``), so ``R_old``
    is in [0, 1] in expectation like the nDCG it is mixed with. ``mode="expected"`` uses the
    exact expectations of the page (infinitely many users per page); ``"sampled"`` one
    simulated user per sampled page, whose random numbers are a hash of ``seed``, the prompt
    indices and the completions (a pure function of what the engine passes: a resumed run
    draws the same users).

    Args:
        click_probability: ``(N, L)`` ``P(click | examined)`` per candidate.
        long_view_probability: ``(N, L)`` ``P(long view | click)`` per candidate.
        click_model: the world's click model (position weights, examination, exposure depth).
        long_view_weight: weight of a long view against a click (>= 0).
        mode: ``"expected"`` or ``"sampled"``.
        seed: seed of the sampled users.
        user_budget: ``"sampled"`` only: the most simulated users the run may show pages to
            (one per sampled page); None for no limit. ``users`` counts them.
    """

    def __init__(  # noqa: PLR0913 - the world, the objective and how feedback is drawn
        self,
        click_probability: torch.Tensor,
        long_view_probability: torch.Tensor,
        click_model: ClickModel,
        long_view_weight: float = 1.0,
        mode: str = "expected",
        seed: int = 0,
        user_budget: int | None = None,
    ):
        check_ndim_2("click_probability", click_probability)
        if click_probability.shape != long_view_probability.shape:
            raise ValueError("click_probability and long_view_probability must match, (N, L)")
        if mode not in FEEDBACK_MODES:
            raise ValueError(f"unknown feedback mode {mode!r}; valid: {', '.join(FEEDBACK_MODES)}")
        if not (math.isfinite(long_view_weight) and long_view_weight >= 0):
            raise ValueError(f"long_view_weight must be finite and >= 0, got {long_view_weight}")
        L = click_probability.shape[1]
        self.click = click_probability.double()
        self.long_view = long_view_probability.double()
        self.click_model, self.mode, self.seed = click_model, mode, int(seed)
        self.long_view_weight = float(long_view_weight)
        self.user_budget, self.users = user_budget, 0
        self.position_weights = torch.from_numpy(click_model.position_weights(L))  # (L,)
        self.examination = torch.from_numpy(click_model.examination(L))  # (L,)
        values = self.click * (1.0 + self.long_view_weight * self.long_view)  # (N, L)
        self.best = best_page_value(values, self.position_weights).clamp(min=1e-12)  # (N,)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.click.shape)

    def run_key(self) -> tuple[list[torch.Tensor], list[object]]:
        settings = [self.mode, self.seed, self.long_view_weight, repr(self.click_model)]
        return [self.click, self.long_view], ["simulated", *settings]

    def _users(self, rows: torch.Tensor, completions: list[str]) -> tuple[torch.Tensor, ...]:
        text = f"{self.seed}|{rows.tolist()}|{'|'.join(completions)}"
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        generator = torch.Generator().manual_seed(digest)
        lo, hi = self.click_model.exposure_depth
        B, L = len(rows), self.click.shape[1]
        depth = torch.randint(lo, hi + 1, (B,), generator=generator)  # (B,)
        return depth, torch.rand(B, L, 2, generator=generator, dtype=torch.float64)

    def __call__(
        self, rankings: torch.Tensor, rows: torch.Tensor, completions: list[str]
    ) -> dict[str, torch.Tensor]:
        click, long_view = self.click[rows], self.long_view[rows]  # (B, L)
        if self.mode == "expected":
            return _page_value(
                rankings,
                click,
                long_view,
                self.position_weights,
                self.long_view_weight,
                self.best[rows],
            )
        self.users += len(rows)
        if self.user_budget is not None and self.users > self.user_budget:
            raise RuntimeError(
                f"online_sampled has shown pages to {self.users} simulated users, over "
                f"reranker_grpo.reward.online_user_budget = {self.user_budget}"
            )
        clicks, long_views = sample_page_feedback(
            rankings, click, long_view, self.examination, *self._users(rows, completions)
        )
        clicks, long_views = clicks.sum(-1), long_views.sum(-1)  # (B,)
        value = (clicks + self.long_view_weight * long_views) / self.best[rows]
        return {"r_old": value.float(), "clicks": clicks.float(), "long_views": long_views.float()}


def check_ndim_2(name: str, tensor: torch.Tensor) -> None:
    if tensor.dim() != 2:
        raise ValueError(f"{name} must have shape (N, L), got {tuple(tensor.shape)}")


class PageReward:
    """The page-level GRPO reward ``alpha * R_old + beta * nDCG@k(y, y^s)`` (docs/methods/experience.md, step 5), called
    as the engine's ``RewardFn``.

    Row ``i`` of the tensors belongs to prompt ``i`` of the trainer (``GRPOTrainer(policy,
    prompts=list(range(N)), ...)`` with a ``RerankerPolicy`` over the same sessions). Sessions
    must have all ``L`` candidates real: padding slots would take a share of the ``y^s`` gains.

    Args:
        business: ``R_old``: ``FittedClickFeedback`` (a click model fitted to the logs),
            ``SimulatedFeedback`` (the simulated users' clicks and long views on the sampled
            page) or ``LoggedClicks`` (click nDCG@k of the logged session).
        exp_scores: ``(N, L)`` experience scores ``s_exp``; their gains define ``y^s``.
        alpha: weight of ``R_old``.
        beta: weight of the experience alignment.
        k: nDCG cut-off (>= 1) of the experience alignment.
        gain_mode: gains of ``y^s`` (``algorithms.rank_gains``: ``rank`` or ``minmax``).

    Returns (on call with ``(completions, prompt_index (B,))``): ``{"page", "r_old",
    "exp_ndcg"}`` (and the simulated ``clicks`` / ``long_views`` per page), each ``(B,)``,
    with ``page = alpha * r_old + beta * exp_ndcg``.
    """

    def __init__(  # noqa: PLR0913 - the reward's own knobs
        self,
        business: FittedClickFeedback | LoggedClicks | SimulatedFeedback,
        exp_scores: torch.Tensor,
        alpha: float,
        beta: float,
        k: int,
        gain_mode: str = "rank",
    ):
        if exp_scores.dim() != 2 or tuple(exp_scores.shape) != business.shape:
            raise ValueError(
                f"business feedback and exp_scores must both have shape (N, L), got "
                f"{business.shape} and {tuple(exp_scores.shape)}"
            )
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not (math.isfinite(alpha) and math.isfinite(beta)):
            raise ValueError(f"alpha and beta must be finite, got {alpha}, {beta}")
        if gain_mode not in GAIN_MODES:
            raise ValueError(f"unknown gain_mode {gain_mode!r}; valid: {', '.join(GAIN_MODES)}")
        self.business = business
        self.exp_scores = exp_scores.float()
        self.exp_gains = rank_gains(self.exp_scores, gain_mode)  # (N, L)
        self.alpha, self.beta, self.k, self.gain_mode = float(alpha), float(beta), int(k), gain_mode

    def run_key(self) -> tuple[list[torch.Tensor], list[object]]:
        """Tensors and settings that make a run (``page_grpo.run_page_grpo``'s checkpoint key)."""
        tensors, settings = self.business.run_key()
        return [*tensors, self.exp_scores], [
            *settings,
            self.alpha,
            self.beta,
            self.k,
            self.gain_mode,
        ]

    def __call__(
        self, completions: list[str], prompt_index: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        rankings = parse_rankings(completions, self.exp_scores.shape[1])  # (B, L)
        rows = prompt_index.long().cpu()
        gains = self.exp_gains[rows]  # (B, L)
        out = self.business(rankings, rows, completions)
        out["exp_ndcg"] = ndcg_at_k(gains.gather(1, rankings), self.k, ideal_gains=gains)
        out["page"] = self.alpha * out["r_old"] + self.beta * out["exp_ndcg"]
        return out


def page_reward_of(  # noqa: PLR0913 - the reward's block, its data and its two worlds
    reward_params: Mapping[str, Any],
    sessions: pd.DataFrame,
    catalogue: pd.DataFrame,
    exp_scores: torch.Tensor,
    click_model: ClickModel,
    fitted_click_model: LoggedClickModel | None = None,
) -> PageReward:
    """The ``PageReward`` of a ``reranker_grpo.reward`` block on the training ``sessions``.
    ``r_old`` names the business objective (module docstring): ``fitted_click_model``
    (``FittedClickFeedback`` of ``fitted_click_model`` on the observable columns only, its
    lower confidence bounds at ``pessimism`` standard deviations),
    ``oracle_expected`` / ``online_sampled`` (``SimulatedFeedback`` of ``click_model``, with
    ``feedback_seed`` and ``online_user_budget``), ``logged_clicks`` (``LoggedClicks`` at
    ``k``); ``long_view_weight`` weighs long views in the first three."""
    source = reward_params["r_old"]
    if source not in R_OLD_SOURCES:
        raise ValueError(f"unknown r_old {source!r}; valid: {', '.join(R_OLD_SOURCES)}")
    if source == FITTED:
        if fitted_click_model is None:
            raise ValueError("r_old: fitted_click_model needs the fitted click model")
        # The hidden columns are dropped before anything is read: this reward cannot see them.
        seen_sessions, seen_catalogue = observable(sessions, catalogue)
        attractiveness, long_view, weights = fitted_response(
            fitted_click_model, seen_sessions, seen_catalogue, reward_params.get("pessimism", 0.0)
        )
        business = FittedClickFeedback(
            attractiveness, long_view, weights, long_view_weight=reward_params["long_view_weight"]
        )
    elif source in SIMULATED_SOURCES:
        if not has_truth(sessions):
            raise ValueError(
                f"reranker_grpo.reward.r_old: {source} needs simulated users, who read the "
                "hidden relevance and true_quality of the synthetic world (or of a catalogue of "
                "your own with true_quality); these logs have none: set "
                "reranker_grpo.reward.r_old: fitted_click_model or logged_clicks "
                "(docs/howto/own_data.md)"
            )
        click, long_view = candidate_response(sessions, catalogue, click_model)
        business = SimulatedFeedback(
            torch.from_numpy(click),
            torch.from_numpy(long_view),
            click_model,
            long_view_weight=reward_params["long_view_weight"],
            mode=SIMULATED_SOURCES[source],
            seed=reward_params["feedback_seed"],
            user_budget=reward_params["online_user_budget"],
        )
    else:
        business = LoggedClicks(logged_sessions(sessions).clicks, k=reward_params["k"])
    return PageReward(
        business,
        exp_scores,
        alpha=reward_params["alpha"],
        beta=reward_params["beta"],
        k=reward_params["k"],
        gain_mode=reward_params["gain_mode"],
    )


def variant_params(params: Mapping[str, Any], variant: Mapping[str, Any]) -> dict[str, Any]:
    """``reranker_grpo`` with an R_old variant's changes (``reranker_grpo.r_old_variants``):
    its ``r_old`` and ``pessimism`` replace the reward's, its ``click_model`` keys the click
    model's (``effects`` group by group); a key it leaves out (or sets to null under
    ``r_old`` / ``pessimism``) keeps the method's value.

    >>> base = {
    ...     "reward": {"r_old": "fitted_click_model", "pessimism": 1.0},
    ...     "click_model": {"l2": 1.0, "effects": {"item": 0.5, "query_item": 0.3}},
    ... }
    >>> out = variant_params(base, {"pessimism": 0.0, "click_model": {"effects": {"item": 0.0}}})
    >>> out["reward"], out["click_model"]
    ({'r_old': 'fitted_click_model', 'pessimism': 0.0}, {'l2': 1.0, 'effects': {'item': 0.0, 'query_item': 0.3}})
    """
    reward = dict(params["reward"])
    reward.update({k: variant[k] for k in ("r_old", "pessimism") if variant.get(k) is not None})
    changes = variant.get("click_model") or {}
    click_model = {**params["click_model"], **{k: v for k, v in changes.items() if k != "effects"}}
    if "effects" in changes:
        click_model["effects"] = {
            **(params["click_model"].get("effects") or {}),
            **(changes["effects"] or {}),
        }
    return {**params, "reward": reward, "click_model": click_model}


def needs_truth(reward_params: Mapping[str, Any]) -> bool:
    """Whether a ``reranker_grpo.reward`` block's R_old shows pages to the simulated users
    (who read the hidden truth, which logs of your own do not have)."""
    return reward_params["r_old"] in SIMULATED_SOURCES


def check_user_budget(reward_params: Mapping[str, Any], config: GRPOConfig) -> int:
    """The simulated users a page-GRPO run shows pages to (``online_sampled``: one per sampled
    page, ``steps * prompts_per_step * group_size``; 0 otherwise).

    Raises:
        ConfigError: more than ``reranker_grpo.reward.online_user_budget``, before training.
    """
    if reward_params["r_old"] != ONLINE_SAMPLED:
        return 0
    users = config.steps * config.prompts_per_step * config.group_size
    budget = reward_params["online_user_budget"]
    if budget is not None and users > budget:
        raise ConfigError(
            f"reranker_grpo.reward.r_old: online_sampled would show {users} pages to simulated "
            f"users (grpo.steps x prompts_per_step x group_size), over "
            f"reranker_grpo.reward.online_user_budget = {budget}: raise the budget or lower "
            "grpo.steps"
        )
    return users
