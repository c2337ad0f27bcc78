"""The attention heatmaps of nmt-serve's page, drawn on the server as SVG (nmt/serve/page.py places them).

    svg = "\n".join(heatmap_parts(weights, src_pieces, tgt_pieces))   # cross-attention: (T, S), T output x S source
    lines = heatmap_parts(weights, src_pieces, src_pieces, kind="self", layer=1, head=2, gradient="blues-0-1-2")

A map has its column pieces across the top, its row pieces down the side and a colour scale from 0 to 1.
The cross-attention map ("source →" across, "output ↓" down) has a row per output piece; a self-attention map
("attended →" across, "query ↓" down) has a row per source position asking (the query) and a column per source
position attended (the key), so each row sums to 1. Every cell is a <rect class="cell"> carrying data-t (its row),
data-s (its column) and data-w (the weight, exactly as the JSON API gives it, or a block's in a map drawn coarser)
and a <title> (the browser's tooltip), so the page reads without JavaScript; nmt/serve/static/serve.js adds a live
tooltip and, on hovering a row's piece, highlights the pieces it attends to. All text is escaped. A map drawn
coarser (nmt/serve/bounds.py) has groups of pieces as its rows and columns: `group` > 1 goes into data-group and the
label.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from functools import lru_cache
from html import escape

# matplotlib's "Blues" (ColorBrewer), light = little weight, dark = much
STOPS = ["#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"]
FONT = 12  # px, labels
AXES = {"cross": ("source →", "output ↓"), "self": ("attended →", "query ↓")}  # across the top, down the side


@lru_cache(maxsize=1 << 16)  # weights come rounded to 4 decimals: a few thousand distinct values a page
def colour(w: float) -> str:
    """The colour of weight `w` (clipped to [0, 1]), interpolated between STOPS."""
    x = min(max(float(w), 0.0), 1.0) * (len(STOPS) - 1)
    i = min(int(x), len(STOPS) - 2)
    f = x - i
    a, b = STOPS[i], STOPS[i + 1]
    rgb = [round(int(a[k : k + 2], 16) * (1 - f) + int(b[k : k + 2], 16) * f) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def text_width(text: str) -> float:
    """About how many pixels `text` takes at FONT px (wide East Asian characters count double)."""
    return sum(FONT * (1.0 if unicodedata.east_asian_width(c) in "WF" else 0.6) for c in text)


def _fmt(w: float) -> str:
    return f"{w:.3f}"


def _geometry(cols: list[str], rows: list[str], axes: tuple[str, str]) -> dict[str, float]:
    """Cell size, margins and outer size (px) of a heatmap: labels (and the axis names) get the room they need."""
    S, T = len(cols), len(rows)
    n = max(S, T)
    c = 20 if n <= 16 else 18 if n <= 30 else 14 if n <= 60 else 10  # cell size
    label_top = max([text_width(p) for p in cols] + [60]) + 10
    left = max([text_width(p) for p in rows] + [60] + [text_width(a) for a in axes]) + 12
    top = label_top + 8
    bar_x = left + S * c + 14
    bar_h = max(T * c, 90)
    return {
        "c": c,
        "label_top": label_top,
        "left": left,
        "top": top,
        "bar_x": bar_x,
        "bar_h": bar_h,
        "width": bar_x + 12 + 30,
        "height": top + bar_h + 26,
    }


def _cell_title(kind: str, col: str, row: str, w: float) -> str:
    """A cell's tooltip; `col` and `row` come escaped."""
    if kind == "self":
        return f"query {row} · attends {col} · weight {_fmt(w)}"
    return f"source {col} · output {row} · weight {_fmt(w)}"


def heatmap_parts(
    weights: list[list[float]],
    src_pieces: list[str],
    tgt_pieces: list[str],
    *,
    kind: str = "cross",
    layer: int | None = None,
    head: int | None = None,
    gradient: str = "blues",
    group: int = 1,
) -> Iterator[str]:
    """The lines of the heatmap's <svg> element: `src_pieces` across the top, `tgt_pieces` (the rows) down the
    side; the cells come a row a line, so a page is drawn a part at a time (nmt/serve/render.py).

    kind "cross" (the decoder's attention: rows are output pieces) or "self" (the encoder's self-attention: rows
    are queries, columns keys, both the source pieces; `layer` and `head`, 1-based, go into data-layer and
    data-head). `gradient` is the id of the colour scale's gradient, unique per map where a map may be hidden;
    `group` the pieces a row or column spans in a map drawn coarser."""
    S, T = len(src_pieces), len(tgt_pieces)
    across, down = AXES[kind]
    g = _geometry(src_pieces, tgt_pieces, (across, down))
    c, label_top, left, top, bar_x, bar_h = (g[k] for k in ("c", "label_top", "left", "top", "bar_x", "bar_h"))
    width, height = g["width"], g["height"]
    if kind == "self":
        classes, extra = "heatmap self-attention-map", f' data-kind="self" data-layer="{layer}" data-head="{head}"'
        label = f"self-attention weights, layer {layer}, head {head}: {T} query pieces by {S} source pieces"
    else:
        classes, extra = "heatmap", ""
        label = f"attention weights: {T} output pieces by {S} source pieces"
    if group > 1:
        extra += f' data-group="{group}"'
        label = label.replace(" pieces", " groups").replace(": ", f" (groups of up to {group} pieces): ", 1)
    out = [
        f'<svg class="{classes}" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" data-rows="{T}" data-cols="{S}"{extra} '
        f'aria-label="{label}">'
    ]
    out.append(f'<text class="axis" x="{left - 8:.0f}" y="{top - 26:.0f}" text-anchor="end">{across}</text>')
    out.append(f'<text class="axis" x="{left - 8:.0f}" y="{top - 8:.0f}" text-anchor="end">{down}</text>')
    for s, piece in enumerate(src_pieces):  # column labels, rotated, with a background for highlighting
        x = left + s * c
        out.append(
            f'<rect class="srcbg" data-s="{s}" x="{x}" y="{top - label_top - 4:.0f}" width="{c}" '
            f'height="{label_top:.0f}" rx="3"/>'
        )
        out.append(
            f'<text class="src" data-s="{s}" transform="translate({x + c / 2:.1f},{top - 6:.0f}) '
            f'rotate(-90)" dominant-baseline="central">{escape(piece)}</text>'
        )
    for t, piece in enumerate(tgt_pieces):  # row labels
        y = top + t * c
        out.append(f'<rect class="tgtbg" data-t="{t}" x="2" y="{y}" width="{left - 6:.0f}" height="{c}" rx="3"/>')
        out.append(
            f'<text class="tgt" data-t="{t}" tabindex="0" x="{left - 8:.0f}" y="{y + c / 2:.1f}" '
            f'text-anchor="end" dominant-baseline="central">{escape(piece)}</text>'
        )
    yield from out
    cols = [escape(p) for p in src_pieces]
    for t, row in enumerate(weights[:T]):
        y, piece = top + t * c, escape(tgt_pieces[t])
        yield "\n".join(
            f'<rect class="cell" data-t="{t}" data-s="{s}" data-w="{w!r}" x="{left + s * c}" '
            f'y="{y}" width="{c}" height="{c}" fill="{colour(w)}"><title>{_cell_title(kind, cols[s], piece, w)}'
            f"</title></rect>"
            for s, w in enumerate(row[:S])
        )
    yield f'<rect class="frame" x="{left}" y="{top}" width="{S * c}" height="{T * c}"/>'
    yield _colour_bar(bar_x, top, bar_h, gradient)
    yield "</svg>"


def _colour_bar(x: float, y: float, h: float, gradient: str = "blues") -> str:
    stops = "".join(f'<stop offset="{k / (len(STOPS) - 1):.3f}" stop-color="{col}"/>' for k, col in enumerate(STOPS))
    parts = [
        f'<g class="scale"><defs><linearGradient id="{gradient}" x1="0" y1="1" x2="0" y2="0">{stops}'
        f'</linearGradient></defs><rect x="{x:.0f}" y="{y:.0f}" width="12" height="{h:.0f}" fill="url(#{gradient})"/>'
    ]
    for value in (0.0, 0.5, 1.0):
        ty = y + h * (1 - value)
        parts.append(
            f'<line x1="{x + 12:.0f}" x2="{x + 16:.0f}" y1="{ty:.1f}" y2="{ty:.1f}"/>'
            f'<text x="{x + 19:.0f}" y="{ty:.1f}" dominant-baseline="central">{value:g}</text>'
        )
    parts.append(
        f'<text class="axis" x="{x + 6:.0f}" y="{y + h + 4:.0f}" text-anchor="middle" '
        'dominant-baseline="hanging">weight</text></g>'
    )
    return "".join(parts)
