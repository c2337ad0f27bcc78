"""nmt-serve: several checkpoints side by side behind one page and a JSON API (the command: nmt.cli.serve).

    models.py       loading the checkpoints and translating one text with all of them; no HTTP here
    app.py          the ASGI application (Starlette): the page, the JSON API and the static files
    connections.py  the HTTP connection layer (uvicorn's h11 protocol): read deadlines and a connection cap
    page.py         the page as HTML: per checkpoint its translation, attention and any self-attention maps
    heatmap.py      the attention heatmaps as SVG, drawn on the server (cross-attention and self-attention)
    examples.py     the page's example sentences, from the test split of the checkpoint's corpus where that is cheap
    static/         the page's stylesheet, script and icon (shipped in the package)

Serving reads checkpoints and decodes; it never imports training (a contract in pyproject.toml).
"""
