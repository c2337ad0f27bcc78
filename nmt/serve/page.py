"""nmt-serve's page as HTML, with each checkpoint's attention drawn on the server as SVG heatmaps.

    parts = render_page(models, examples, limits, form={"text": "...", "beam": "5"}, result=reply, error=None)
    html = "".join(part + "\n" for part in parts)        # nmt/serve/render.py draws it a part at a time instead

Each checkpoint's card has its translation and its cross-attention heatmap (nmt/serve/heatmap.py: source
pieces across the top, output pieces down the side). A checkpoint with self-attention in its encoder adds,
below that, a section "Self-attention over the source": a layer and a head selector and one source x source
map per (layer, head), each a <figure class="sa-map" data-layer data-head> captioned "layer l, head h" (all
1-based, as the selectors' values: the JSON's weights[l - 1][h - 1]). Without JavaScript every map shows and
the selectors stay hidden; serve.js shows the selectors and only the chosen map. All text from a request or a
checkpoint is escaped. Every map is bounded (nmt/serve/bounds.py): past its share of cells it is drawn coarser,
and a note under it says so.

render_page is a generator: nothing is drawn until its first part is asked for, which fits every map to its
bound and lets go of the reply's full weights, so a page on its way holds only what it draws.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from html import escape

from nmt.serve.bounds import MAP_CELLS, SELF_ATTENTION_CELLS, Grid, coarseness, fit
from nmt.serve.examples import Examples
from nmt.serve.heatmap import heatmap_parts
from nmt.serve.models import Limits, ServedModel, short_path


def bounded(result: dict | None) -> dict | None:
    """A checkpoint's result as the page draws it: "grid" (the cross-attention map fitted to MAP_CELLS) and
    "self_attention" {"layers", "heads", "grids": [layer][head]} fitted to SELF_ATTENTION_CELLS, in place of the
    full weights."""
    if result is None:
        return None
    view = {k: v for k, v in result.items() if k not in ("weights", "self_attention")}
    src, tgt = result["src_pieces"], result["tgt_pieces"]
    view["grid"] = fit(result["weights"], src, tgt, MAP_CELLS) if result["has_alignment"] else None
    sa = result.get("self_attention")
    if sa:
        share = SELF_ATTENTION_CELLS // max(1, sa["layers"] * sa["heads"])
        grids = [[fit(head, src, src, share) for head in layer] for layer in sa["weights"]] if src else []
        view["self_attention"] = {"layers": sa["layers"], "heads": sa["heads"], "grids": grids}
    return view


def _model_card(model: ServedModel, result: dict | None) -> Iterator[str]:
    s = model.settings
    facts = [escape(short_path(model.path)), f"{s['parameters']:,} parameters"]
    if s.get("step") is not None:
        facts.append(f"step {s['step']}")
    if s.get("best_valid"):
        b = s["best_valid"]
        facts.append(f"valid {escape(str(b['metric'])).upper()} {b['value']}")
    kind = "map" if result and (result["has_alignment"] or result.get("self_attention")) else "no-map"
    head = (
        f'<section class="model {kind}" data-model="{model.index}"><h2>{escape(model.label)}</h2>'
        f'<p class="facts" title="{escape(model.path)}">{" · ".join(facts)}</p>'
    )
    if result is None:
        yield head + '<p class="placeholder">Translate a sentence to see this model\'s attention.</p></section>'
        return
    yield (
        head + f'<p class="hyp">{escape(result["hypothesis"]) or "<em>(empty output)</em>"}</p>'
        f'<p class="meta">{len(result["src_pieces"])} source pieces → {len(result["tgt_pieces"])} output '
        f"pieces · {result['time'] * 1000:.0f} ms</p>"
    )
    if result.get("note"):
        yield f'<p class="note">{escape(result["note"])}</p>'
    grid: Grid | None = result["grid"]
    if grid is not None:
        yield '<div class="heatmap-wrap">'
        yield from heatmap_parts(grid.weights, grid.cols, grid.rows, group=grid.group)
        yield "</div>"
        if grid.group > 1:
            yield f'<p class="note coarse">{escape(coarseness(grid.group, "This map is"))}</p>'
        yield '<p class="readout" aria-live="polite">Hover a cell, or an output piece on the left.</p>'
    else:
        yield (
            '<p class="no-alignment">attention=none: the decoder reads one fixed sentence vector, so '
            "there is no alignment to show.</p>"
        )
    if result.get("self_attention"):
        yield from _self_attention_section(model.index, result["self_attention"])
    yield "</section>"


def _self_attention_section(index: int, sa: dict) -> Iterator[str]:
    """The encoder's self-attention: a layer and a head selector (shown by serve.js) and a map per (layer, head)."""
    layers, heads, grids = sa["layers"], sa["heads"], sa["grids"]

    def select(name: str, n: int) -> str:
        ident = f"sa-{name}-{index}"
        options = "".join(f'<option value="{i}">{i}</option>' for i in range(1, n + 1))
        field = f'<select id="{ident}" class="sa-{name}">{options}</select>'
        return f'<span class="sa-pick"><label for="{ident}">{name.capitalize()}</label> {field}</span>'

    yield "".join(
        [
            f'<section class="self-attention" data-layers="{layers}" data-heads="{heads}">',
            "<h3>Self-attention over the source</h3>",
            f'<p class="sa-about">The encoder\'s {layers} layer{"s" if layers != 1 else ""} of self-attention, '
            f"{heads} head{'s' if heads != 1 else ''} each: every source piece (a row, the query) spreads a weight "
            "of 1 over the source pieces it attends to (the columns).</p>",
            f'<div class="sa-controls" hidden>{select("layer", layers)} {select("head", heads)}</div>',
        ]
    )
    group = grids[0][0].group if grids else 1
    if group > 1:
        yield f'<p class="note coarse">{escape(coarseness(group, "These maps are"))}</p>'
    yield '<div class="sa-maps">'
    if not grids:
        yield '<p class="placeholder">No source pieces: nothing to attend to.</p>'
    for layer, row in enumerate(grids, start=1):
        for head, grid in enumerate(row, start=1):
            caption = f"layer {layer}, head {head}"
            yield f'<figure class="sa-map" data-layer="{layer}" data-head="{head}"><figcaption>{caption}</figcaption>'
            yield '<div class="heatmap-wrap">'
            yield from heatmap_parts(
                grid.weights,
                grid.cols,
                grid.rows,
                kind="self",
                layer=layer,
                head=head,
                gradient=f"blues-{index}-{layer}-{head}",
                group=grid.group,
            )
            yield "</div></figure>"
    yield "</div>"
    yield '<p class="readout" aria-live="polite">Hover a cell, or a query piece on the left.</p></section>'


def render_page(
    models: list[ServedModel],
    examples: Examples,
    limits: Limits,
    form: dict[str, str],
    result: dict | None = None,
    error: str | None = None,
) -> Iterator[str]:
    """The whole page, a part at a time: the form, any error or notes, and one card per checkpoint."""
    results = {r["model"]: r for r in result["results"]} if result else {}
    cards = [bounded(results.get(m.index)) for m in models]
    del results
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
    del result  # the full weights: only the bounded cards are drawn from here on
    yield from parts
    yield '<main class="results">'
    for model, card in zip(models, cards, strict=True):
        yield from _model_card(model, card)
    yield "</main>"
    api = json.dumps({"text": "...", "beam": 5})
    yield (
        f"<footer>JSON API: <code>POST /translate {escape(api)}</code> · <code>GET /api/models</code> "
        "(see the README)</footer>"
    )
    yield '<div id="tip" class="tip" hidden></div><script src="/static/serve.js"></script></body></html>'
