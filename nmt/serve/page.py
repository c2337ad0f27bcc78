"""nmt-serve's page as HTML, with each checkpoint's attention drawn on the server as an SVG heatmap.

    html = render_page(models, examples, limits, form={"text": "...", "beam": "5"}, result=reply, error=None)
    svg = heatmap_svg(weights, src_pieces, tgt_pieces)     # weights (T, S) nested lists, T output x S source

The heatmap has the source pieces across the top, the output pieces down the side and a colour scale
from 0 to 1. Every cell is a <rect class="cell"> carrying data-t, data-s and data-w (the weight, exactly
as the JSON API gives it) and a <title> (the browser's tooltip: source piece, output piece, weight), so the
page reads without JavaScript; nmt/serve/static/serve.js adds a live tooltip and, on hovering an output piece,
highlights the source pieces it attends to. All text from a request or a checkpoint is escaped.
"""

from __future__ import annotations

import json
import unicodedata
from html import escape

from nmt.serve.examples import Examples
from nmt.serve.models import Limits, ServedModel, short_path

# matplotlib's "Blues" (ColorBrewer), light = little weight, dark = much
STOPS = ["#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"]
FONT = 12  # px, labels


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


def _geometry(src_pieces: list[str], tgt_pieces: list[str]) -> dict[str, float]:
    """Cell size, margins and outer size (px) of a heatmap: labels get the room their text needs."""
    S, T = len(src_pieces), len(tgt_pieces)
    n = max(S, T)
    c = 20 if n <= 16 else 18 if n <= 30 else 14 if n <= 60 else 10  # cell size
    label_top = max([text_width(p) for p in src_pieces] + [60]) + 10
    left = max([text_width(p) for p in tgt_pieces] + [60]) + 12
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


def heatmap_svg(weights: list[list[float]], src_pieces: list[str], tgt_pieces: list[str]) -> str:
    """The heatmap as an <svg> element: source pieces across the top, output pieces down the side."""
    S, T = len(src_pieces), len(tgt_pieces)
    g = _geometry(src_pieces, tgt_pieces)
    c, label_top, left, top, bar_x, bar_h = (g[k] for k in ("c", "label_top", "left", "top", "bar_x", "bar_h"))
    width, height = g["width"], g["height"]
    out = [
        f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" data-rows="{T}" data-cols="{S}" '
        f'aria-label="attention weights: {T} output pieces by {S} source pieces">'
    ]
    out.append(f'<text class="axis" x="{left - 8:.0f}" y="{top - 26:.0f}" text-anchor="end">source →</text>')
    out.append(f'<text class="axis" x="{left - 8:.0f}" y="{top - 8:.0f}" text-anchor="end">output ↓</text>')
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
    for t, row in enumerate(weights[:T]):
        for s, w in enumerate(row[:S]):
            title = f"source {src_pieces[s]} · output {tgt_pieces[t]} · weight {_fmt(w)}"
            out.append(
                f'<rect class="cell" data-t="{t}" data-s="{s}" data-w="{w!r}" x="{left + s * c}" '
                f'y="{top + t * c}" width="{c}" height="{c}" fill="{colour(w)}"><title>{escape(title)}'
                f"</title></rect>"
            )
    out.append(f'<rect class="frame" x="{left}" y="{top}" width="{S * c}" height="{T * c}"/>')
    out.append(_colour_bar(bar_x, top, bar_h))
    out.append("</svg>")
    return "\n".join(out)


def _colour_bar(x: float, y: float, h: float) -> str:
    stops = "".join(f'<stop offset="{k / (len(STOPS) - 1):.3f}" stop-color="{col}"/>' for k, col in enumerate(STOPS))
    parts = [
        f'<g class="scale"><defs><linearGradient id="blues" x1="0" y1="1" x2="0" y2="0">{stops}'
        f'</linearGradient></defs><rect x="{x:.0f}" y="{y:.0f}" width="12" height="{h:.0f}" fill="url(#blues)"/>'
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


def _model_card(model: ServedModel, result: dict | None) -> str:
    s = model.settings
    facts = [escape(short_path(model.path)), f"{s['parameters']:,} parameters"]
    if s.get("step") is not None:
        facts.append(f"step {s['step']}")
    if s.get("best_valid"):
        b = s["best_valid"]
        facts.append(f"valid {escape(str(b['metric'])).upper()} {b['value']}")
    kind = "map" if result and result["has_alignment"] else "no-map"
    head = (
        f'<section class="model {kind}" data-model="{model.index}"><h2>{escape(model.label)}</h2>'
        f'<p class="facts" title="{escape(model.path)}">{" · ".join(facts)}</p>'
    )
    if result is None:
        return head + '<p class="placeholder">Translate a sentence to see this model\'s attention.</p></section>'
    body = [
        f'<p class="hyp">{escape(result["hypothesis"]) or "<em>(empty output)</em>"}</p>',
        f'<p class="meta">{len(result["src_pieces"])} source pieces → {len(result["tgt_pieces"])} output '
        f"pieces · {result['time'] * 1000:.0f} ms</p>",
    ]
    if result.get("note"):
        body.append(f'<p class="note">{escape(result["note"])}</p>')
    if result["has_alignment"]:
        body.append(
            '<div class="heatmap-wrap">'
            + heatmap_svg(result["weights"], result["src_pieces"], result["tgt_pieces"])
            + "</div>"
        )
        body.append('<p class="readout" aria-live="polite">Hover a cell, or an output piece on the left.</p>')
    else:
        body.append(
            '<p class="no-alignment">attention=none: the decoder reads one fixed sentence vector, so '
            "there is no alignment to show.</p>"
        )
    return head + "".join(body) + "</section>"


def render_page(
    models: list[ServedModel],
    examples: Examples,
    limits: Limits,
    form: dict[str, str],
    result: dict | None = None,
    error: str | None = None,
) -> str:
    """The whole page: the form, any error or notes, and one card per checkpoint."""
    beam = form.get("beam", "1")
    radios = "".join(
        f'<label><input type="radio" name="beam" value="{v}"{" checked" if beam == v else ""}> {name}</label>'
        for v, name in (("1", "greedy"), ("5", "beam 5"))
    )
    example_buttons = "".join(
        f'<button type="submit" class="example" name="example" value="{escape(e)}">{escape(e)}</button>'
        for e in examples.sentences
    )
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>nmt-serve: compare attention</title>",
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">',
        '<link rel="stylesheet" href="/static/serve.css"></head><body>',
        "<header><h1>Compare attention</h1>"
        f'<p class="sub">{len(models)} checkpoint{"s" if len(models) != 1 else ""}, one sentence: '
        "each model's translation and where it looked.</p></header>",
        '<form method="post" action="/" id="form"><label for="text" class="field">Source sentence</label>',
        f'<textarea id="text" name="text" rows="3" spellcheck="false">{escape(form.get("text", ""))}</textarea>',
        f'<div class="controls"><span class="decoding">Decoding: {radios}</span>',
        '<button type="submit" id="translate">Translate</button>',
        f'<span class="limits">up to {limits.max_chars:,} characters and {limits.max_pieces} pieces</span></div>',
    ]
    if examples.sentences or examples.source:
        parts.append(
            f'<div class="examples"><span class="field">Examples</span>{example_buttons}'
            f'<p class="source">{escape(examples.source)}</p></div>'
        )
    parts.append("</form>")
    if error:
        parts.append(f'<div class="error" role="alert">{escape(error)}</div>')
    if result:
        parts += [f'<div class="notes" role="status">{escape(n)}</div>' for n in result["notes"]]
        how = "greedy" if result["beam"] == 1 else f"beam {result['beam']}"
        parts.append(f'<p class="translated">Translated ({how}): <q>{escape(result["text"])}</q></p>')
    results = {r["model"]: r for r in result["results"]} if result else {}
    parts.append('<main class="results">' + "".join(_model_card(m, results.get(m.index)) for m in models) + "</main>")
    api = json.dumps({"text": "...", "beam": 5})
    parts.append(
        f"<footer>JSON API: <code>POST /translate {escape(api)}</code> · <code>GET /api/models</code> "
        "(see the README)</footer>"
    )
    parts.append('<div id="tip" class="tip" hidden></div><script src="/static/serve.js"></script></body></html>')
    return "\n".join(parts)
