"""Renderings of the credit inspector's token rows (``creditflow.training.credit``): an HTML
page and a figure that show, for the recorded completions, where each strategy puts the
credit, ``advantage x weight`` per token.

Every strategy of a comparison trains from the same warm start with the same seeds, so at the
first step they sample the same completions: that step shows one set of completions under
each strategy; later recorded steps show each strategy's own. Only the first seed is shown.
The colour scale is shared by every strategy of a step: blue positive, red negative, white 0
(a token the strategy did not select is white).

With the deserved credit on (``credit_inspector.deserved``: a ``deserved`` column), each
completion first shows the credit its tokens deserve (one line for the strategies that sampled
that same completion, on a colour scale of its own: reward units, not advantage units), then
each strategy's assigned credit; ``deserved_recovery`` scores how well each strategy's credit
recovers the deserved one (``reporting.recovery.recovery_scores``) and the page lists it.

``tables``: strategy name -> its credit table (the rows of ``training.credit``, with a ``seed``
column when they come from a comparison).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping

import matplotlib
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from creditflow.reporting.recovery import recovery_scores  # noqa: E402

matplotlib.use("Agg")  # headless: figures are written to files, never shown

SEGMENT_COLOURS = {"translation": "#e69f00", "reasoning": "#009e73", "other": "#bbbbbb"}


def first_seed(tables: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Each non-empty table restricted to the smallest seed of all tables (all rows when there
    is no ``seed`` column); empty tables are left out."""
    tables = {name: table for name, table in tables.items() if not table.empty}
    seeds = [table["seed"].min() for table in tables.values() if "seed" in table.columns]
    if not seeds:
        return tables
    seed = min(seeds)
    return {name: table[table["seed"] == seed] for name, table in tables.items()}


def credit_scale(tables: Mapping[str, pd.DataFrame], column: str = "credit") -> float:
    """The largest |``column``| of the tables that have it (1.0 when all are 0), the colour
    scale's end."""
    largest = max(
        (table[column].abs().max() for table in tables.values() if column in table.columns),
        default=0.0,
    )
    return float(largest) if largest and math.isfinite(largest) else 1.0


def has_deserved(tables: Mapping[str, pd.DataFrame]) -> bool:
    """Whether any table carries the deserved credit (``credit_inspector.deserved``)."""
    return any("deserved" in table.columns for table in tables.values())


def deserved_recovery(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per strategy (and seed) and recorded step, how well its credit (``advantage x weight``)
    recovers the deserved credit of the same tokens: ``recovery_auc``, ``recovery_spearman``,
    ``recovery_pooled_spearman`` and the completions they average over
    (``reporting.recovery.recovery_scores``).
    Tables without a ``deserved`` column are left out; no table: an empty frame."""
    found = []
    for name, table in tables.items():
        if table.empty or "deserved" not in table.columns:
            continue
        keys = ["seed", "step"] if "seed" in table.columns else ["step"]
        for key, at in table.groupby(keys, sort=True):
            rows = sorted(at["row"].unique())
            width = int(at["position"].max()) + 1
            assigned = torch.zeros(len(rows), width, dtype=torch.float64)
            deserved, mask = torch.zeros_like(assigned), torch.zeros_like(assigned)
            index = {row: i for i, row in enumerate(rows)}
            for row, position, credit, value in at[
                ["row", "position", "credit", "deserved"]
            ].itertuples(index=False):
                assigned[index[row], position] = credit
                deserved[index[row], position] = value
                mask[index[row], position] = 1.0
            scores = recovery_scores(assigned, deserved, mask)
            found.append(
                {
                    "strategy": name,
                    **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                    **{k.removeprefix("credit/"): v for k, v in scores.items()},
                }
            )
    return pd.DataFrame(found)


def credit_colour(value: float, scale: float) -> str:
    """``value`` in [-scale, scale] as a hex colour: white at 0, blue (#2166ac) at +scale, red
    (#b2182b) at -scale, linear in between.

    >>> credit_colour(0.0, 1.0), credit_colour(1.0, 1.0), credit_colour(-2.0, 1.0)
    ('#ffffff', '#2166ac', '#b2182b')
    """
    end = (0x21, 0x66, 0xAC) if value >= 0 else (0xB2, 0x18, 0x2B)
    share = min(abs(value) / scale, 1.0) if scale > 0 else 0.0
    rgb = [round(255 + (c - 255) * share) for c in end]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def credit_html(tables: Mapping[str, pd.DataFrame], title: str = "Token credit") -> str:
    """A self-contained HTML page (inline styles, no script): per recorded step and completion
    slot, one line per strategy with its tokens on a background coloured by ``credit``; each
    token's tooltip gives its segment, advantage, weight, entropy, image log-prob difference
    and ratio; a coloured underline marks its segment."""
    shown = first_seed(tables)
    parts = [
        "<!doctype html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title></head>",
        '<body style="font-family:sans-serif;max-width:1200px;margin:1em auto">',
        f"<h1>{html.escape(title)}</h1>",
    ]
    if not shown:
        parts.append(
            "<p>No credit rows: the credit inspector was off (credit_inspector: null).</p>"
        )
        return "\n".join([*parts, "</body></html>"])
    seed = next(iter(shown.values())).get("seed", pd.Series([None])).iloc[0]
    legend = " ".join(
        f'<span style="border-bottom:3px solid {colour}">{name}</span>'
        for name, colour in SEGMENT_COLOURS.items()
    )
    parts.append(
        f"<p>Background: advantage x weight of each token, blue positive, red negative, white 0 "
        f"(scale shared by the strategies of a step). Underline: segment ({legend}). Hover a "
        f"token for its values.{'' if seed is None else f' Seed {seed}.'}</p>"
    )
    steps = sorted(set().union(*(table["step"].unique() for table in shown.values())))
    for step in steps:
        at_step = {name: table[table["step"] == step] for name, table in shown.items()}
        scale = credit_scale(at_step)
        parts.append(f"<h2>Step {step} (colour scale ±{scale:.3g})</h2>")
        if has_deserved(at_step):
            parts.append(
                f"<p>Deserved credit: colour scale ±{credit_scale(at_step, 'deserved'):.3g} "
                "(reward units).</p>"
            )
        rows = sorted(set().union(*(table["row"].unique() for table in at_step.values())))
        for row in rows:
            parts.append('<table style="border-collapse:collapse;margin-bottom:1em">')
            parts += _completion_lines(at_step, row, scale)
            parts.append("</table>")
    if has_deserved(shown):
        parts += _recovery_section(deserved_recovery(shown))
    return "\n".join([*parts, "</body></html>"])


def _completion_lines(at_step: Mapping[str, pd.DataFrame], row: int, scale: float) -> list[str]:
    """The lines of one completion slot: for each distinct completion (the strategies that
    sampled the same tokens share it), its deserved credit first, when recorded, then each of
    those strategies' assigned credit."""
    groups: dict[tuple[int, ...], list[tuple[str, pd.DataFrame]]] = {}
    for name, table in at_step.items():
        tokens = table[table["row"] == row].sort_values("position")
        if not tokens.empty:
            groups.setdefault(tuple(tokens["token_id"]), []).append((name, tokens))
    deserved_scale = credit_scale(at_step, "deserved")
    lines = []
    for members in groups.values():
        names, tokens = [n for n, _ in members], members[0][1]
        if "deserved" in tokens.columns:
            label = f"deserved ({', '.join(names)})"
            lines.append(_strategy_line(label, tokens, deserved_scale, "deserved"))
        lines += [_strategy_line(name, own, scale) for name, own in members]
    return lines


def _recovery_section(scores: pd.DataFrame) -> list[str]:
    """The recovery scores as an HTML table."""
    head = (
        "<h2>Credit recovery</h2><p>Per completion, then averaged: the AUC with which "
        "|advantage x weight| separates the tokens of high deserved credit (at least half the "
        "completion's largest |deserved|) from those of about none (at most a tenth), and the "
        "Spearman rank correlation of assigned and deserved credit; pooled_spearman ranks the "
        "tokens of all recorded completions at once (whether the credit points the way of the "
        "deserved one across completions).</p>"
    )
    return [head, scores.to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="NaN")]


def _strategy_line(name: str, tokens: pd.DataFrame, scale: float, column: str = "credit") -> str:
    first = tokens.iloc[0]
    rewards = ", ".join(
        f"{column.removeprefix('reward/')} {first[column]:.3g}"
        for column in tokens.columns
        if column.startswith("reward/") and "/" not in column.removeprefix("reward/")
    )
    head = (
        f"<b>{html.escape(name)}</b><br>prompt {first['prompt_id']}, completion "
        f"{first['completion']}<br>{html.escape(rewards)}<br>"
        + (
            f"selected {tokens['selected'].mean():.0%}"
            if column == "credit"
            else "Monte Carlo estimate"
        )
    )
    spans = []
    for token in tokens.itertuples(index=False):
        tip = (
            f"segment {token.segment}; advantage {token.advantage:.4g}; weight {token.weight:.3g}"
            f"; entropy {token.entropy:.3g}; image logp diff {token.image_logp_diff:.3g}; "
            f"ratio {token.ratio:.4g}{' (clipped)' if token.clipped else ''}"
        )
        if "deserved" in tokens.columns:
            tip += f"; deserved {token.deserved:.4g}; prefix value {token.prefix_value:.4g}"
        value = getattr(token, column)
        style = (
            f"background:{credit_colour(value, scale)};"
            f"border-bottom:3px solid {SEGMENT_COLOURS.get(token.segment, '#bbbbbb')}"
            # Dark backgrounds get white text, so every token stays readable.
            + (";color:#ffffff" if abs(value) > 0.6 * scale else "")
        )
        spans.append(
            f'<span title="{html.escape(tip)}" style="{style}">{html.escape(token.token)}</span>'
        )
    return (
        '<tr><td style="vertical-align:top;padding:4px 8px;width:14em;font-size:small">'
        f"{head}</td>"
        '<td style="vertical-align:top;padding:4px;font-family:monospace;white-space:pre-wrap">'
        f"{''.join(spans)}</td></tr>"
    )


def plot_credit(tables: Mapping[str, pd.DataFrame]) -> Figure:
    """One panel per (strategy, recorded step): the recorded completions as rows, their token
    positions as columns, coloured by ``credit`` on a scale shared by each step's panels
    (``RdBu``: blue positive, red negative, white 0; grey beyond a completion's end); a black
    tick ends each completion's translation segment."""
    shown = first_seed(tables)
    if not shown:
        figure = Figure(figsize=(6, 1.5))
        figure.text(0.5, 0.5, "credit inspector off: no rows", ha="center", va="center")
        return figure
    steps = sorted(set().union(*(table["step"].unique() for table in shown.values())))
    figure = Figure(figsize=(4.5 * len(steps), 1.2 + 1.1 * len(shown)), layout="constrained")
    axes = figure.subplots(len(shown), len(steps), squeeze=False)
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#dddddd")
    for column, step in enumerate(steps):
        at_step = {name: table[table["step"] == step] for name, table in shown.items()}
        scale = credit_scale(at_step)
        for line, (name, table) in enumerate(at_step.items()):
            ax = axes[line, column]
            image = _credit_grid(table)
            shown_image = ax.imshow(
                image, aspect="auto", cmap=cmap, vmin=-scale, vmax=scale, interpolation="nearest"
            )
            for row, end in enumerate(_translation_ends(table)):
                if end is not None:
                    ax.plot([end + 0.5, end + 0.5], [row - 0.5, row + 0.5], color="black", lw=1.5)
            selected = table["selected"].mean() if not table.empty else float("nan")
            ax.set_title(f"{name}, step {step}: {selected:.0%} selected", fontsize="small")
            ax.set_yticks(range(image.shape[0]))
            ax.set_ylabel("completion", fontsize="small")
            if line == len(shown) - 1:
                ax.set_xlabel("token position", fontsize="small")
        figure.colorbar(shown_image, ax=axes[:, column], shrink=0.8, label="advantage x weight")
    return figure


def _credit_grid(table: pd.DataFrame) -> np.ndarray:
    """(rows, positions) credit, NaN beyond each completion's end."""
    if table.empty:
        return np.full((1, 1), np.nan)
    rows = sorted(table["row"].unique())
    grid = np.full((len(rows), int(table["position"].max()) + 1), np.nan)
    index = {row: i for i, row in enumerate(rows)}
    for row, position, credit in table[["row", "position", "credit"]].itertuples(index=False):
        grid[index[row], position] = credit
    return grid


def _translation_ends(table: pd.DataFrame) -> list[int | None]:
    """Per recorded row (in order), the position of its last translation token when the
    completion has a reasoning segment, else None."""
    ends = []
    for _, tokens in table.groupby("row", sort=True):
        translation = tokens.loc[tokens["segment"] == "translation", "position"]
        if (tokens["segment"] == "reasoning").any() and not translation.empty:
            ends.append(int(translation.max()))
        else:
            ends.append(None)
    return ends
