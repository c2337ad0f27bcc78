"""nmt-serve: several checkpoints side by side behind one page and a JSON API (the command: nmt.cli.serve).

    models.py       loading the checkpoints and translating one text with all of them; no HTTP here
    app.py          the ASGI application (Starlette): the page, the JSON API and the static files
    lanes.py        each checkpoint's translations in two threads (short requests, long ones), earliest deadline first
    connections.py  the HTTP connection layer (uvicorn's h11 protocol): read deadlines and a connection cap
    turns.py        pipelined requests served a few at a time, all connections together
    refusal_log.py  uvicorn's warning for requests refused before the app, at most once a minute
    render.py       pages drawn in a worker thread and streamed, JSON replies encoded off the event loop
    page.py         the page as HTML: per checkpoint its translation, attention and any self-attention maps
    bounds.py       the page's size bound: a map past its share of cells is drawn coarser
    heatmap.py      the attention heatmaps as SVG, drawn on the server (cross-attention and self-attention)
    examples.py     the page's example sentences, from the test split of the checkpoint's corpus where that is cheap
    static/         the page's stylesheet, script and icon (shipped in the package)

Serving reads checkpoints and decodes; it never imports training (a contract in pyproject.toml).
"""
