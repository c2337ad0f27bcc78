"""Pages and JSON replies made off the event loop, a page sent as it is drawn (nmt/serve/app.py uses this).

    renderer = Renderer()
    response = await renderer.page(render_page(...), status, headers)   # nmt/serve/page.py's parts
    response = await renderer.json(reply, headers)                      # encoded in a worker thread

The event loop reads and answers every connection, so a page drawn on it held up every other request: a
self-attention checkpoint's page of some 30 MB took seconds. Here one worker thread draws pages, about CHUNK bytes
at a time: the first part before the reply starts (so a failure is still a 500, and the request keeps its place
of Limits.max_active until then), every further part once the connection has taken the one before (uvicorn waits
for a full send buffer to drain), so a client that does not read costs the drawing of no more than its buffers
hold until the send deadline cuts it (nmt/serve/connections.py). The worker draws the parts of several pages in
turn, in the order asked. A page of one part (the empty form, an error) goes out whole, with its length; a longer
one streams (chunked). The map sizes are bounded before drawing (nmt/serve/bounds.py).
JSON replies (a self-attention reply is L x H x S x S weights, a MB at 100 pieces) are encoded in asyncio's
default threads, as Starlette's JSONResponse would encode them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.responses import HTMLResponse, Response, StreamingResponse

CHUNK = 64 * 1024  # bytes of a page drawn at a time (the transport's high-water mark)


def take(parts: Iterator[str], size: int) -> tuple[bytes, bool]:
    """The next parts of a page, each ended by a newline, about `size` bytes (or the rest); whether that was all."""
    out, n = [], 0
    for part in parts:
        out.append(part)
        n += len(part) + 1
        if n >= size:
            return ("\n".join(out) + "\n").encode(), False
    return ("\n".join(out) + "\n").encode() if out else b"", True


def encode_json(content: Any) -> bytes:
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


class Renderer:
    """The worker thread that draws pages (one, so drawing never takes more than one core from the event loop and
    the models), and the encoding of JSON replies."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="nmt-render")

    async def page(self, parts: Iterator[str], status: int, headers: dict[str, str]) -> Response:
        loop = asyncio.get_running_loop()
        first, done = await loop.run_in_executor(self.pool, take, parts, CHUNK)
        if done:
            return HTMLResponse(first, status, headers=headers)

        async def rest() -> AsyncIterator[bytes]:
            yield first
            finished = False
            while not finished:
                chunk, finished = await loop.run_in_executor(self.pool, take, parts, CHUNK)
                if chunk:
                    yield chunk

        return StreamingResponse(rest(), status, headers=headers, media_type="text/html; charset=utf-8")

    async def json(self, content: Any, headers: dict[str, str], status: int = 200) -> Response:
        body = await asyncio.get_running_loop().run_in_executor(None, encode_json, content)
        return Response(body, status, headers=headers, media_type="application/json")
