"""Seeded synthetic visual problems for ToR (docs/methods/tor.md): the answer is in the picture.

ToR reweights perception tokens, the completion tokens whose log-probability moves when the
image is removed; these tasks make perception necessary. Three kinds, each drawn with Pillow
only on a white square:

- ``count_shapes``: coloured circles, squares and triangles on a 4 x 4 grid (one shape per
  cell, never touching), each asked kind 0..``max_count`` times. "How many red circles are
  there?" (one read) / "How many red circles plus blue squares are there?" (two).
- ``bar_chart``: three or four bars A, B, C(, D) with integer heights 1..``max_bar`` over grid
  lines at every unit (labelled 0, 5, 10). "What is the height of bar B?" (one read) / "What
  is the height of bar B minus the height of bar A?" (two; minus questions name the taller
  bar first, so answers are never negative).
- ``read_numbers``: two numbers in 1..``max_number`` drawn large in the picture. "What is the
  larger number in the picture?" (one read) / "Add the two numbers in the picture." /
  "Subtract the smaller number in the picture from the larger one." (two).

Each problem asks for one quantity read off the picture with probability ``single_fraction``,
else it combines two with + or -; the one-read problems are the easier half of the set (no
arithmetic), so a weak policy solves some of them and some of its samples (README, "The
ToR world").

Conventions, chosen once here:

- The question text never determines the answer: it only names *which* quantities to read,
  and the same text recurs across a set with different answers (tested with a text-only
  majority baseline).
- Text is drawn with Pillow's built-in bitmap font (``ImageFont.load_default_imagefont``,
  6 x 11 pixel glyphs) enlarged by nearest-neighbour scaling, and shapes without
  anti-aliasing: no font files, no FreeType, so the PNG bytes are identical on every machine
  with the same Pillow/zlib for the same seed.
- ``n_problems`` is the total; kinds alternate in the order given (row ``i`` has kind
  ``kinds[i % len(kinds)]``). Each kind draws from its own stream seeded by ``(seed, kind)``,
  so a kind's problems do not depend on which other kinds were asked for. IDs are
  ``tor-{kind}-{index:05d}`` with a per-kind index.
- ``spec`` keeps the drawing parameters as JSON: the answer is recomputed from it in the tests,
  and ``render_tor_image(spec, image_size)`` redraws the picture from it.
"""

from __future__ import annotations

import functools
import io
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
from PIL import Image, ImageDraw, ImageFont

TOR_INSTRUCTION = (
    "Look at the image and answer the question. "
    "Reason step by step and put the final answer in \\boxed{}."
)

# The project's visual schema first (id, question, answer), then the ToR extras.
TOR_COLUMNS = ("id", "kind", "question", "answer", "reasoning", "image_png", "spec")
TOR_KINDS = ("count_shapes", "bar_chart", "read_numbers")

COLORS: Mapping[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "blue": (30, 70, 220),
    "green": (20, 150, 50),
}
SHAPES = ("circle", "square", "triangle")
BAR_LABELS = "ABCD"
BACKGROUND = (255, 255, 255)
BAR_COLOR = (70, 110, 200)
GRID_COLOR = (215, 215, 215)
INK = (0, 0, 0)

GRID_CELLS = 4  # count_shapes: a GRID_CELLS x GRID_CELLS board, one shape per cell at most
AXIS_TOP = 10  # bar_chart: the axis runs 0..AXIS_TOP
MAX_DISTRACTORS = 6  # count_shapes: 1..6 shapes of kinds not asked about
MIN_IMAGE_SIZE = 56


def generate_tor_problems(
    n_problems: int,
    seed: int = 0,
    image_size: int = 112,
    kinds: Sequence[str] = TOR_KINDS,
    *,
    max_number: int = 20,
    max_count: int = 4,
    max_bar: int = 9,
    single_fraction: float = 0.5,
) -> pd.DataFrame:
    """Draw ``n_problems`` visual arithmetic problems with their pictures as PNG bytes.

    Args:
        n_problems: total number of rows (>= 0), kinds alternating in the order of ``kinds``.
        seed: each kind draws from ``random.Random(f"tor:{seed}:{kind}")`` (string seeds hash
            with SHA-512), so the frame, PNG bytes included, is the same on every run.
        image_size: side of the square pictures in pixels (>= 56).
        kinds: names from ``TOR_KINDS``, no repeats.
        max_number: ``read_numbers`` draws numbers in ``[1, max_number]`` (>= 2).
        max_count: ``count_shapes`` draws each asked (colour, shape) ``0..max_count`` times
            (1..7: two asked kinds at most plus a distractor fit the 16 cells).
        max_bar: ``bar_chart`` draws heights in ``[1, max_bar]`` (2..``AXIS_TOP``).
        single_fraction: probability in [0, 1] that a problem asks for one quantity read off
            the picture instead of two combined with + or -.

    Returns:
        DataFrame with columns ``TOR_COLUMNS``: ``id`` (``tor-{kind}-{index:05d}``),
        ``kind``, ``question``, ``answer`` (canonical integer string, >= 0), ``reasoning``
        (a gold chain such as ``"2 red circles + 3 blue squares = 5."``), ``image_png``
        (PNG bytes, decode with ``decode_image``) and ``spec`` (the drawing parameters as JSON).
    """
    if isinstance(n_problems, bool) or not isinstance(n_problems, int) or n_problems < 0:
        raise ValueError(f"n_problems must be a non-negative int, got {n_problems!r}")
    unknown = [kind for kind in kinds if kind not in TOR_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown or no kinds {unknown or list(kinds)}; valid: {list(TOR_KINDS)}")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"kinds must not repeat, got {list(kinds)}")
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be >= {MIN_IMAGE_SIZE} pixels, got {image_size}")
    if max_number < 2:
        raise ValueError(f"max_number must be >= 2, got {max_number}")
    if not 1 <= max_count <= (GRID_CELLS * GRID_CELLS - 1) // 2:
        raise ValueError(f"max_count must be in 1..7 (the 4 x 4 grid), got {max_count}")
    if not 2 <= max_bar <= AXIS_TOP:
        raise ValueError(f"max_bar must be in 2..{AXIS_TOP} (the chart's axis), got {max_bar}")
    if not 0.0 <= single_fraction <= 1.0:
        raise ValueError(f"single_fraction must be in [0, 1], got {single_fraction}")
    options = {
        "max_number": max_number,
        "max_count": max_count,
        "max_bar": max_bar,
        "single_fraction": single_fraction,
    }

    streams = {kind: random.Random(f"tor:{seed}:{kind}") for kind in kinds}
    counters = dict.fromkeys(kinds, 0)
    rows = []
    for i in range(n_problems):
        kind = kinds[i % len(kinds)]
        spec = _DRAWERS[kind](streams[kind], **options)
        question, answer, reasoning = describe_tor_spec(spec)
        rows.append(
            {
                "id": f"tor-{kind}-{counters[kind]:05d}",
                "kind": kind,
                "question": question,
                "answer": str(answer),
                "reasoning": reasoning,
                "image_png": encode_image(render_tor_image(spec, image_size)),
                "spec": json.dumps(spec, sort_keys=True),
            }
        )
        counters[kind] += 1
    frame = pd.DataFrame(rows, columns=list(TOR_COLUMNS))
    return frame.astype({c: "str" for c in TOR_COLUMNS if c != "image_png"})


# --- drawing parameters -------------------------------------------------------------------


def _draw_count_shapes(
    rng: random.Random, *, max_count: int, single_fraction: float, **_: Any
) -> dict[str, Any]:
    combos = [(color, shape) for color in COLORS for shape in SHAPES]
    asked = rng.sample(combos, 1 if rng.random() < single_fraction else 2)
    counts = [rng.randint(0, max_count) for _ in asked]
    if not any(counts):  # at least one asked shape, so "0" is not the typical answer
        counts[rng.randrange(len(counts))] = rng.randint(1, max_count)
    others = [combo for combo in combos if combo not in asked]
    n_cells = GRID_CELLS * GRID_CELLS
    n_distractors = rng.randint(1, min(MAX_DISTRACTORS, n_cells - sum(counts)))
    items = [combo for combo, count in zip(asked, counts, strict=True) for _ in range(count)]
    items += [rng.choice(others) for _ in range(n_distractors)]
    cells = rng.sample(range(n_cells), len(items))
    return {
        "kind": "count_shapes",
        "asked": [list(combo) for combo in asked],
        "shapes": [
            {"color": color, "shape": shape, "cell": cell}
            for (color, shape), cell in sorted(
                zip(items, cells, strict=True), key=lambda item: item[1]
            )
        ],
    }


def _draw_bar_chart(
    rng: random.Random, *, max_bar: int, single_fraction: float, **_: Any
) -> dict[str, Any]:
    single = rng.random() < single_fraction
    n_bars = rng.choice((3, 4))
    heights = [rng.randint(1, max_bar) for _ in range(n_bars)]
    if single:
        label = BAR_LABELS[rng.randrange(n_bars)]
        return {"kind": "bar_chart", "heights": heights, "op": "read", "bars": [label]}
    first, second = rng.sample(range(n_bars), 2)
    op = rng.choice(("plus", "minus"))
    if op == "minus" and heights[first] < heights[second]:
        first, second = second, first  # the taller bar is named first
    return {
        "kind": "bar_chart",
        "heights": heights,
        "op": op,
        "bars": [BAR_LABELS[first], BAR_LABELS[second]],
    }


def _draw_read_numbers(
    rng: random.Random, *, max_number: int, single_fraction: float, **_: Any
) -> dict[str, Any]:
    single = rng.random() < single_fraction
    return {
        "kind": "read_numbers",
        "numbers": [rng.randint(1, max_number), rng.randint(1, max_number)],
        "op": "larger" if single else rng.choice(("add", "subtract")),
        # Vertical placement of each number as a fraction of the free height.
        "offsets": [round(rng.random(), 3), round(rng.random(), 3)],
    }


_DRAWERS: Mapping[str, Callable[..., dict[str, Any]]] = {
    "count_shapes": _draw_count_shapes,
    "bar_chart": _draw_bar_chart,
    "read_numbers": _draw_read_numbers,
}


# --- question, answer and gold reasoning ----------------------------------------------------


def describe_tor_spec(spec: Mapping[str, Any]) -> tuple[str, int, str]:
    """``(question, answer, reasoning)`` of a problem, from its drawing parameters alone.

    >>> describe_tor_spec(
    ...     {"kind": "read_numbers", "numbers": [7, 12], "op": "add", "offsets": [0.0, 0.0]}
    ... )
    ('Add the two numbers in the picture.', 19, 'The numbers are 7 and 12. 7 + 12 = 19.')
    """
    kind = spec.get("kind")
    if kind not in _DESCRIBERS:
        raise ValueError(f"unknown kind {kind!r}; valid: {list(TOR_KINDS)}")
    return _DESCRIBERS[kind](spec)


def _describe_count_shapes(spec: Mapping[str, Any]) -> tuple[str, int, str]:
    asked = [tuple(combo) for combo in spec["asked"]]
    names = [f"{color} {shape}s" for color, shape in asked]
    counts = [
        sum((item["color"], item["shape"]) == combo for item in spec["shapes"]) for combo in asked
    ]
    answer = sum(counts)
    terms = [
        f"{count} {color} {shape}{'' if count == 1 else 's'}"
        for count, (color, shape) in zip(counts, asked, strict=True)
    ]
    if len(asked) == 1:
        verb = "is" if answer == 1 else "are"
        return f"How many {names[0]} are there?", answer, f"There {verb} {terms[0]}."
    question = f"How many {names[0]} plus {names[1]} are there?"
    return question, answer, f"{' + '.join(terms)} = {answer}."


def _describe_bar_chart(spec: Mapping[str, Any]) -> tuple[str, int, str]:
    if spec["op"] == "read":
        (label,) = spec["bars"]
        height = spec["heights"][BAR_LABELS.index(label)]
        return f"What is the height of bar {label}?", height, f"Bar {label} is {height}."
    first, second = spec["bars"]
    a, b = (spec["heights"][BAR_LABELS.index(label)] for label in (first, second))
    read = f"Bar {first} is {a} and bar {second} is {b}."
    if spec["op"] == "plus":
        question = f"What is the height of bar {first} plus the height of bar {second}?"
        return question, a + b, f"{read} {a} + {b} = {a + b}."
    question = f"What is the height of bar {first} minus the height of bar {second}?"
    return question, a - b, f"{read} {a} - {b} = {a - b}."


def _describe_read_numbers(spec: Mapping[str, Any]) -> tuple[str, int, str]:
    x, y = spec["numbers"]
    read = f"The numbers are {x} and {y}."
    high, low = max(x, y), min(x, y)
    if spec["op"] == "larger":
        return "What is the larger number in the picture?", high, f"{read} The larger is {high}."
    if spec["op"] == "add":
        return "Add the two numbers in the picture.", x + y, f"{read} {x} + {y} = {x + y}."
    question = "Subtract the smaller number in the picture from the larger one."
    return question, high - low, f"{read} {high} - {low} = {high - low}."


_DESCRIBERS: Mapping[str, Callable[[Mapping[str, Any]], tuple[str, int, str]]] = {
    "count_shapes": _describe_count_shapes,
    "bar_chart": _describe_bar_chart,
    "read_numbers": _describe_read_numbers,
}


# --- rendering ----------------------------------------------------------------------------


def render_tor_image(spec: Mapping[str, Any], image_size: int = 112) -> Image.Image:
    """Draw a problem's picture (RGB, ``image_size`` square) from its drawing parameters."""
    kind = spec.get("kind")
    if kind not in _RENDERERS:
        raise ValueError(f"unknown kind {kind!r}; valid: {list(TOR_KINDS)}")
    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    _RENDERERS[kind](image, spec)
    return image


def shape_cell_box(cell: int, image_size: int) -> tuple[int, int, int, int]:
    """Pixel box ``(left, top, right, bottom)``, inclusive, of the shape drawn in grid ``cell``.

    Cells are numbered row by row; a shape fills its cell minus a margin of 1/5 of the cell
    on each side, so shapes in neighbouring cells never touch.
    """
    step = image_size / GRID_CELLS
    margin = round(step / 5)
    row, col = divmod(cell, GRID_CELLS)
    left, top = round(col * step) + margin, round(row * step) + margin
    right, bottom = round((col + 1) * step) - margin - 1, round((row + 1) * step) - margin - 1
    return left, top, right, bottom


def _render_count_shapes(image: Image.Image, spec: Mapping[str, Any]) -> None:
    draw = ImageDraw.Draw(image)
    for item in spec["shapes"]:
        left, top, right, bottom = shape_cell_box(item["cell"], image.width)
        fill = COLORS[item["color"]]
        if item["shape"] == "circle":
            draw.ellipse((left, top, right, bottom), fill=fill)
        elif item["shape"] == "square":
            draw.rectangle((left, top, right, bottom), fill=fill)
        else:
            draw.polygon([((left + right) / 2, top), (right, bottom), (left, bottom)], fill=fill)


def bar_chart_layout(image_size: int, n_bars: int) -> dict[str, Any]:
    """Pixel geometry of a bar chart: baseline row, pixels per unit, each bar's columns.

    Value ``v`` sits on row ``round(baseline - v * unit)``; bar ``i`` fills the columns
    ``bars[i][0]..bars[i][1]`` from that row down to ``baseline - 1``.
    """
    label_scale = _text_scale(image_size)
    tick_scale = max(1, label_scale // 2)
    axis_left = 2 * _FONT_WIDTH * tick_scale + 4  # room for the "10" tick label
    baseline = image_size - _FONT_HEIGHT * label_scale - 4  # room for the bar letters
    top = max(4, image_size // 20)
    unit = (baseline - top) / AXIS_TOP
    slot = (image_size - axis_left - 2) / n_bars
    bars = [
        (round(axis_left + (i + 0.2) * slot), round(axis_left + (i + 0.8) * slot))
        for i in range(n_bars)
    ]
    return {
        "baseline": baseline,
        "unit": unit,
        "bars": bars,
        "axis_left": axis_left,
        "tick_scale": tick_scale,
        "label_scale": label_scale,
    }


def _render_bar_chart(image: Image.Image, spec: Mapping[str, Any]) -> None:
    draw = ImageDraw.Draw(image)
    size = image.width
    heights = spec["heights"]
    layout = bar_chart_layout(size, len(heights))
    baseline, unit, axis_left = layout["baseline"], layout["unit"], layout["axis_left"]
    tick_scale, label_scale = layout["tick_scale"], layout["label_scale"]
    for value in range(AXIS_TOP + 1):
        y = round(baseline - value * unit)
        draw.line((axis_left, y, size - 1, y), fill=INK if value == 0 else GRID_COLOR)
        if value % 5 == 0:
            label_y = min(max(0, y - _FONT_HEIGHT * tick_scale // 2), size - _FONT_HEIGHT)
            _draw_text(image, (1, label_y), str(value), INK, tick_scale)
    draw.line((axis_left, round(baseline - AXIS_TOP * unit), axis_left, baseline), fill=INK)
    for (left, right), height, label in zip(
        layout["bars"], heights, BAR_LABELS[: len(heights)], strict=True
    ):
        draw.rectangle((left, round(baseline - height * unit), right, baseline - 1), fill=BAR_COLOR)
        label_x = (left + right + 1) // 2 - _FONT_WIDTH * label_scale // 2
        _draw_text(image, (label_x, baseline + 3), label, INK, label_scale)


def _render_read_numbers(image: Image.Image, spec: Mapping[str, Any]) -> None:
    size = image.width
    scale = max(2, round(3 * size / 112))
    half = size // 2
    for slot, (number, offset) in enumerate(zip(spec["numbers"], spec["offsets"], strict=True)):
        text = str(number)
        width, height = _FONT_WIDTH * len(text) * scale, _FONT_HEIGHT * scale
        x = slot * half + (half - width) // 2
        y = round(offset * (size - height))
        _draw_text(image, (x, y), text, INK, scale)


_RENDERERS: Mapping[str, Callable[[Image.Image, Mapping[str, Any]], None]] = {
    "count_shapes": _render_count_shapes,
    "bar_chart": _render_bar_chart,
    "read_numbers": _render_read_numbers,
}

_FONT_WIDTH, _FONT_HEIGHT = 6, 11  # the bitmap font's digit and capital cell


@functools.cache
def _font() -> ImageFont.ImageFont:
    # Not load_default(): with FreeType present it returns an anti-aliased vector font whose
    # pixels may change with the FreeType version.
    return ImageFont.load_default_imagefont()


def _text_scale(image_size: int) -> int:
    return max(1, round(2 * image_size / 112))


def _draw_text(
    image: Image.Image, xy: tuple[int, int], text: str, fill: tuple[int, int, int], scale: int
) -> None:
    """Draw ``text`` with the bitmap font enlarged ``scale`` times (nearest neighbour)."""
    left, top, right, bottom = _font().getbbox(text)
    mask = Image.new("L", (right, bottom), 0)
    ImageDraw.Draw(mask).text((0, 0), text, font=_font(), fill=255)
    if scale > 1:
        mask = mask.resize((right * scale, bottom * scale), Image.Resampling.NEAREST)
    x, y = xy
    image.paste(fill, (x, y, x + mask.width, y + mask.height), mask)


# --- prompts, targets, PNG bytes ----------------------------------------------------------


def encode_image(image: Image.Image) -> bytes:
    """PNG bytes with no metadata, so equal pixels give equal bytes."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


def decode_image(png_bytes: bytes) -> Image.Image:
    """The RGB picture stored in ``image_png`` (fully loaded, independent of the bytes)."""
    with Image.open(io.BytesIO(png_bytes)) as image:
        return image.convert("RGB")


def tor_prompt(question: str) -> str:
    """The user text after the image: ``TOR_INSTRUCTION``, a blank line, then the question."""
    return f"{TOR_INSTRUCTION}\n\n{question}"


def format_tor_target(reasoning: str, answer: str) -> str:
    """The gold SFT completion: the reasoning chain, then the boxed answer.

    >>> format_tor_target("2 red circles + 3 blue squares = 5.", "5")
    '2 red circles + 3 blue squares = 5. The answer is \\\\boxed{5}'
    """
    answer = str(answer).strip()
    if not answer:
        raise ValueError("answer must be non-empty")
    lead = f"{reasoning.strip()} " if reasoning and reasoning.strip() else ""
    return f"{lead}The answer is \\boxed{{{answer}}}"
