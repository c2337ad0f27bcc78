"""The ASGI application of nmt-serve (Starlette): the page, the JSON API and the static files.

    app = create_app(models, examples, Limits())      # models from nmt.serve.models.load_models
    uvicorn.run(app)                                   # nmt/cli/serve.py binds the socket and runs it

Routes:
    GET  /             the page (nmt/serve/page.py); POST / is its form (text, beam, example)
    POST /translate    JSON {"text": str, "beam": int} -> every checkpoint's translation and attention; a
                       result's "self_attention" is null, or for a checkpoint with self-attention in its encoder
                       {"layers": L, "heads": H, "weights": [layer][head][query][key]} (nmt.serve.models)
    GET  /api/models   the checkpoints' labels and settings, the limits and the example sentences
    GET  /static/...   the page's stylesheet, script and icon (nmt/serve/static, shipped in the package, read once
                       at start and served from memory: a request for one holds a place of Limits.max_active for
                       no longer than one step of the event loop, whoever asks and however often)

Every refusal is {"error": "..."} (the page shows it in a box) with the security headers (HEADERS) and a
status: 400 bad input or a foreign Host header, 404/405 wrong path or method, 408 a body too slow to arrive,
413 a body over the limit (both close the connection), 503 busy or too slow, 500 a bug: the reply names an id,
the server log has the id with the traceback, the client never sees the exception's text; the server keeps
serving. Guard (nmt/serve/guard.py), the outermost layer, gives every response HEADERS and answers the Host
check, the cap on requests in progress (Limits.max_active), refusals and bugs; refusals made before a request
reaches the app (a malformed request, a slow one, too many connections) come from nmt/serve/connections.py in
the same JSON.
The model calls run in two threads per checkpoint (nmt/serve/lanes.py: short requests in a lane of their own, so
they never wait for a long one; in each lane the earliest deadline first), side by side; each lane's lock keeps it
to one request at a time, so concurrent requests never mix. The page is drawn, and replies of POST /translate are
encoded, off the event loop, the page within a size bound and sent as it is drawn (nmt/serve/render.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nmt.serve.examples import Examples
from nmt.serve.guard import CLOSING, HEADERS, Guard, refusal, report_bug
from nmt.serve.lanes import Lanes
from nmt.serve.models import Limits, RequestError, ServedModel, check_beam, clean_text, reply
from nmt.serve.page import render_page
from nmt.serve.render import Renderer

STATIC_DIR = Path(__file__).parent / "static"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "true/false",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def example_body(limits: Limits) -> str:
    return f'{{"text": "...", "beam": 1}} (beam from 1 to {limits.max_beam}, default 1)'


class Server:
    """The loaded models and the bookkeeping of requests in flight (touched by the event loop only)."""

    def __init__(self, models: list[ServedModel], examples: Examples, limits: Limits):
        self.models, self.examples, self.limits = models, examples, limits
        self.pending = 0
        self.renderer = Renderer()  # pages and JSON replies, off the event loop (nmt/serve/render.py)
        # two lanes per model, short requests and long ones, each a thread (nmt/serve/lanes.py)
        self.lanes = [Lanes(f"nmt-model{m.index}") for m in models]

    async def translate(self, text: str, beam: object) -> dict:
        """Every model's translation, each in a worker thread; RequestError if busy or over the time limit."""
        text, notes = clean_text(text, self.limits)
        beam = check_beam(beam, self.limits)
        if self.pending >= self.limits.max_pending:
            raise RequestError(f"busy: {self.pending} requests are being translated; try again in a moment", 503)
        self.pending += 1
        calls = [
            asyncio.wrap_future(lane.submit(len(text) * beam, m.translate, text, beam, self.limits.max_pieces))
            for m, lane in zip(self.models, self.lanes, strict=True)
        ]
        job = asyncio.gather(*calls, return_exceptions=True)  # done when every call is
        job.add_done_callback(self._finished)
        try:  # shield: a request that times out leaves its model calls to finish (and count) in the background
            results = await asyncio.wait_for(asyncio.shield(job), self.limits.timeout)
        except asyncio.TimeoutError:
            raise RequestError(
                f"the translation took longer than {self.limits.timeout:g} s (the models are busy "
                "or the text is long); try again, or send a shorter text or a smaller beam",
                503,
            ) from None
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return reply(text, beam, notes, list(results))

    def _finished(self, job: asyncio.Future) -> None:
        self.pending -= 1


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body, refused with 413 past `limit` bytes and with 408 if it takes over `timeout` seconds.
    Under nmt-serve the connection layer's deadline (from the request's first byte) comes first; this one is
    for the app under another server."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(
            f"the request body has {int(declared):,} bytes, over the limit of {limit:,}; send a shorter text", 413
        )

    async def collect() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(f"the request body is over the limit of {limit:,} bytes; send a shorter text", 413)
        return bytes(body)

    try:
        return await asyncio.wait_for(collect(), timeout)
    except asyncio.TimeoutError:
        raise RequestError(read_timeout_message(timeout), 408) from None
    except ClientDisconnect:  # the client left (or the connection layer closed it); no one reads the reply
        raise RequestError("the client closed the connection before its body arrived") from None


def read_timeout_message(timeout: float) -> str:
    return (
        f"the request took longer than {timeout:g} s to arrive (headers and body, from its first byte); "
        "send it at once, on a new connection"
    )


def parse_translate_body(body: bytes, limits: Limits) -> tuple[str, object]:
    """(text, beam) from a POST /translate body; a RequestError names what is wrong and what to send."""
    send = f"send JSON such as {example_body(limits)}"
    try:
        raw = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(
            f"the body is not valid UTF-8 (byte 0x{body[e.start]:02x} at position {e.start}); {send}, encoded as UTF-8"
        ) from None
    if not raw.strip():
        raise RequestError(f"the body is empty; {send}")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestError(
            f"the body is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); {send}"
        ) from None
    except (ValueError, RecursionError) as e:  # e.g. a number of 5,000 digits, arrays nested 10,000 deep
        raise RequestError(f"the body cannot be read as JSON ({str(e)[:100] or type(e).__name__}); {send}") from None
    if not isinstance(data, dict):
        raise RequestError(f"the body must be a JSON object, not {_JSON_TYPES.get(type(data), 'that')}; {send}")
    unknown = sorted(set(data) - {"text", "beam"})
    if unknown:
        names = ", ".join(json.dumps(k) for k in unknown)
        raise RequestError(f"unknown field(s) {names}; the fields are text (required) and beam (optional)")
    if "text" not in data:
        raise RequestError(f"the field text is missing; {send}")
    if not isinstance(data["text"], str):
        raise RequestError(f"text must be a string, not {_JSON_TYPES.get(type(data['text']), 'that')}")
    return data["text"], data.get("beam", 1)


def parse_form(body: bytes) -> dict[str, str]:
    """The page's form fields (text, beam, example), first value of each; the body is UTF-8, its characters
    percent-encoded (as browsers send them) or not (bytes that are not UTF-8 read as U+FFFD)."""
    try:
        fields = parse_qs(
            body.decode("utf-8", "replace"),
            keep_blank_values=True,
            max_num_fields=10,
            encoding="utf-8",
            errors="replace",
        )
    except ValueError:
        raise RequestError("the form has too many fields; use the page's form") from None
    return {k: v[0] for k, v in fields.items()}


def static_files() -> Route:
    """GET /static/{name}: the files of STATIC_DIR from memory, with an ETag (304 when the browser has it)."""
    files = {}
    for path in STATIC_DIR.iterdir():
        if path.suffix in STATIC_TYPES:
            body = path.read_bytes()
            etag = f'"{hashlib.sha256(body).hexdigest()[:20]}"'
            files[path.name] = (body, {**HEADERS, "Content-Type": STATIC_TYPES[path.suffix], "ETag": etag})

    async def static(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            raise HTTPException(404)
        body, headers = found
        if headers["ETag"] in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers={"ETag": headers["ETag"], **HEADERS})
        return Response(body, headers=headers)

    return Route("/static/{name}", static, methods=["GET"])


def create_app(
    models: list[ServedModel],
    examples: Examples,
    limits: Limits | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> Starlette:
    """The application. With `allowed_hosts` (for a server on loopback; may be empty) it answers only Host
    headers naming localhost, a loopback address or one of those names, which keeps web pages from reaching it
    through DNS rebinding; None: any Host header (a server on a public address)."""
    server = Server(models, examples, limits or Limits())
    lim = server.limits

    async def api_translate(request: Request) -> Response:
        text, beam = parse_translate_body(await read_body(request, lim.max_body, lim.read_timeout), lim)
        return await server.renderer.json(await server.translate(text, beam), HEADERS)

    async def api_models(request: Request) -> Response:
        return JSONResponse(
            {
                "models": [m.describe() for m in server.models],
                "limits": {
                    "max_chars": lim.max_chars,
                    "max_pieces": lim.max_pieces,
                    "max_beam": lim.max_beam,
                    "max_body": lim.max_body,
                    "timeout": lim.timeout,
                },
                "examples": {"sentences": server.examples.sentences, "source": server.examples.source},
            },
            headers=HEADERS,
        )

    async def page(request: Request) -> Response:
        form = {"text": "", "beam": "1"}
        result, error, status = None, None, 200
        try:
            if request.method == "POST":
                form.update(parse_form(await read_body(request, lim.max_body, lim.read_timeout)))
                if form.get("example"):
                    form["text"] = form["example"]
                if form["beam"] not in ("1", "5"):
                    raise RequestError(f"beam must be 1 (greedy) or 5, not {form['beam'][:20]!r}")
                result = await server.translate(form["text"], int(form["beam"]))
        except RequestError as e:
            error, status = str(e), e.status
        except Exception as e:
            error, status = report_bug(e, f"{request.method} /"), 500
        parts = render_page(server.models, server.examples, server.limits, form, result, error)  # drawn lazily
        headers = {**HEADERS, "Connection": "close"} if status in CLOSING else HEADERS
        return await server.renderer.page(parts, status, headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            message = (
                f"{request.method} {request.url.path} is not allowed; the API is POST /translate with "
                f"JSON {example_body(server.limits)} and GET /api/models; the page is GET /"
            )
        elif exc.status_code == 404:
            message = f"no such path {request.url.path}; the page is /, the API POST /translate and GET /api/models"
        else:
            message = str(exc.detail)
        return refusal(message, exc.status_code)

    routes = [
        Route("/", page, methods=["GET", "POST"]),
        Route("/translate", api_translate, methods=["POST"]),
        Route("/api/models", api_models, methods=["GET"]),
        static_files(),
    ]
    names = None if allowed_hosts is None else frozenset(h.lower().strip("[]").rstrip(".") for h in allowed_hosts)
    middleware = [Middleware(Guard, limits=lim, host_names=names)]
    return Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: http_error})
