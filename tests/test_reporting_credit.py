"""The credit inspector's renderings (creditflow.reporting.credit) on hand-made tables."""

import pandas as pd
from matplotlib.figure import Figure

from creditflow.pipelines.comparison import render_token_credit
from creditflow.reporting.credit import credit_colour, credit_html, first_seed, plot_credit


def _table(seed: int, credits: list[float], weights: list[float], tokens: list[str]):
    n = len(credits)
    return pd.DataFrame(
        {
            "seed": seed,
            "step": 1,
            "prompt_id": 7,
            "completion": 0,
            "row": 0,
            "position": range(n),
            "token_id": range(n),
            "token": tokens,
            "segment": ["translation"] + ["reasoning"] * (n - 1),
            "advantage": [c / w if w else 0.5 for c, w in zip(credits, weights, strict=True)],
            "weight": weights,
            "credit": credits,
            "entropy": float("nan"),
            "image_logp_diff": float("nan"),
            "selected": [w > 0 for w in weights],
            "ratio": 1.0,
            "clipped": False,
            "reward/reasoning": 1.0,
            "reward/reasoning/timed_out": 0.0,
        }
    )


TOKENS = ["<b>", " 2", "+2"]


def test_colours_run_from_red_through_white_to_blue():
    # Halfway from white to #2166ac: (255 + 33) / 2 = 144, (255 + 102) / 2 = 178.5 -> 178
    # (round half to even), (255 + 172) / 2 = 213.5 -> 214; to #b2182b: 216.5 -> 216,
    # 139.5 -> 140, 149.
    assert credit_colour(0.5, 1.0) == "#90b2d6"
    assert credit_colour(-0.5, 1.0) == "#d88c95"


def test_the_page_shows_each_strategy_on_the_shared_scale_with_escaped_tokens():
    tables = {
        "grpo": _table(0, [0.5, 0.5, 0.5], [1.0, 1.0, 1.0], TOKENS),
        "tor": _table(0, [1.0, 0.0, 0.0], [2.0, 0.0, 0.0], TOKENS),
        "later_seed": _table(1, [9.0, 9.0, 9.0], [1.0, 1.0, 1.0], TOKENS),
    }
    page = credit_html(first_seed(tables))
    assert "&lt;b&gt;" in page and "<b>grpo</b>" in page and "later_seed" not in page
    assert "colour scale ±1)" in page  # the scale: the largest |credit| of seed 0's rows
    assert page.count("background:#ffffff") == 2  # tor's two unselected tokens
    assert "selected 33%" in page and "selected 100%" in page
    assert "reasoning 1" in page and "timed_out" not in page
    assert "<script" not in page


def test_the_figure_has_a_panel_per_strategy_and_step_and_empty_tables_say_so():
    tables = {"grpo": _table(0, [0.5, -0.5], [1.0, 1.0], [" a", " b"])}
    tables["tapo"] = pd.concat([tables["grpo"], tables["grpo"].assign(step=3)])
    figure = plot_credit(tables)
    panels = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 2 * 2  # 2 strategies x steps 1 and 3 (grpo has no step 3: empty)
    page, empty_figure = render_token_credit(**{"credit/grpo": pd.DataFrame()})
    assert "inspector was off" in page and isinstance(empty_figure, Figure)
