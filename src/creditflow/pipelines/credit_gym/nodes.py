"""Thin nodes of the ``credit_gym`` pipeline: sweep -> dose-response table and figure -> claim
cards (``creditflow.training.gym``, ``creditflow.reporting.credit_gym``)."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
import torch
from matplotlib.figure import Figure

from creditflow.reporting.credit_gym import claim_cards, dose_response, dose_response_figure
from creditflow.tasks.credit_gym import GymKnobs
from creditflow.training.gym import GymSetup, run_sweep

logger = logging.getLogger(__name__)


def run_credit_gym(params: dict[str, Any]) -> pd.DataFrame:
    """Every active strategy at every dose of every swept knob, ``n_seeds`` seeds each: the
    per-seed table (one row per knob, dose, strategy and seed)."""
    if params.get("torch_threads"):
        torch.set_num_threads(params["torch_threads"])
    setup = GymSetup.from_params(params)
    strategies = {name: spec for name, spec in params["strategies"].items() if spec is not None}
    seeds = [params["seed"] + k for k in range(params["n_seeds"])]
    sweeps = {knob: doses for knob, doses in params["sweeps"].items() if doses is not None}
    rows = run_sweep(setup, GymKnobs(**params["defaults"]), sweeps, strategies, seeds)
    return pd.DataFrame(rows)


def build_dose_response(per_seed: pd.DataFrame, params: dict[str, Any]) -> pd.DataFrame:
    """Means over seeds and paired differences with the baseline, per knob, dose, strategy."""
    return dose_response(per_seed, params["baseline"])


def plot_dose_response(table: pd.DataFrame, params: dict[str, Any]) -> Figure:
    """The dose-response figure: one row of panels per knob."""
    return dose_response_figure(table, params["baseline"])


def build_gym_claim_cards(per_seed: pd.DataFrame, params: dict[str, Any]) -> pd.DataFrame:
    """The gym's claim cards (``reporting.credit_gym.GYM_CLAIMS``) with their verdicts."""
    cards = claim_cards(per_seed, params["defaults"])
    for _, card in cards.iterrows():
        logger.info("claim %s @ %s: %s", card["claim"], card.get("dose"), card["verdict"])
    return cards
