"""What every request to nmt-serve passes through, before and after the app's routes (nmt/serve/app.py).

    app = Starlette(routes=..., middleware=[Middleware(Guard, limits=limits, host_names=names)])

Guard, the outermost layer of the application, gives every response the security headers (HEADERS), refuses a
Host header that does not name a loopback server (host_allowed: a defence against DNS rebinding), caps the
requests in progress (Limits.max_active) and turns a RequestError into its refusal and any other exception into
a 500 naming the id under which it was logged (report_bug). Every refusal is {"error": "..."} (refusal).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import secrets

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nmt.serve.models import Limits, RequestError

log = logging.getLogger(__name__)
HOST = re.compile(r"(?:\[(?P<ipv6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::[0-9]*)?")  # host [":" port]
# no script, style or image from anywhere but this server: the page works offline, and injected markup can't run
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


CLOSING = (408, 413)  # refusals that close the connection: the rest of the body is not worth reading


def refusal(message: str, status: int) -> JSONResponse:
    """The documented refusal: {"error": message} with the security headers (and Connection: close for CLOSING)."""
    headers = {**HEADERS, "Connection": "close"} if status in CLOSING else HEADERS
    return JSONResponse({"error": message}, status, headers=headers)


def report_bug(exc: BaseException, where: str) -> str:
    """Log `exc` with its traceback under a fresh id; the message for the client names the id, never the text."""
    ident = secrets.token_hex(4)
    log.error("internal error %s in %s", ident, where, exc_info=exc)
    return f"internal error (id {ident}); the server keeps running, please report this with the id"


def host_allowed(host: str, names: frozenset[str]) -> bool:
    """Whether a Host header names a loopback server: localhost (and *.localhost), a loopback address
    (127.0.0.0/8, [::1]) or one of `names`, with or without a port. The header is read strictly (RFC 9110, 7.2):
    a name or an IPv4 address, or an IPv6 address in brackets, then at most a colon and digits; anything else
    (localhost:evil, [::1]evil, [127.0.0.1], a bare ::1) is refused. Names are never resolved here: under DNS
    rebinding an attacker's name resolves to 127.0.0.1, and its Host header must be refused."""
    found = HOST.fullmatch(host.strip().lower())
    if found is None:
        return False
    if found["ipv6"] is not None:
        try:
            return ipaddress.IPv6Address(found["ipv6"]).is_loopback
        except ValueError:
            return False
    name = found["name"].rstrip(".")
    if name in names or name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.IPv4Address(name).is_loopback
    except ValueError:
        return False


def has_body(scope: Scope) -> bool:
    headers = Headers(scope=scope)
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")


class Guard:
    """The outermost layer of the application (inside Starlette's own last-resort handler, which it leaves
    nothing to): every response gets HEADERS; a foreign Host header is refused (400) when `host_names` is given,
    a request past `limits.max_active` in progress gets 503, a RequestError its status, and any other exception
    a 500 naming the id under which it was logged. A request holds a place from when it has arrived whole until
    its reply is ready (the reply's first message): a body still on its way holds none, so slow senders cannot
    fill the cap (their deadline is read_timeout), and nor can a client slow to read its replies (its deadline
    is the connection layer's write_timeout, nmt/serve/connections.py)."""

    def __init__(self, app: ASGIApp, limits: Limits, host_names: frozenset[str] | None = None):
        self.app, self.limits, self.host_names = app, limits, host_names
        self.active = 0  # requests in progress (touched by the event loop only)

    def busy(self) -> RequestError:
        return RequestError(
            f"busy: {self.active} requests are in progress, the most this server takes; try again in a moment", 503
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = counted = held = False

        def leave() -> None:  # the reply is ready (or there is none): its place goes to the next request
            nonlocal held
            if held:
                self.active -= 1
                held = False

        async def send_secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                leave()  # sending it is the connection layer's business, bounded by its send deadline
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [
                    (k.lower().encode(), v.encode()) for k, v in HEADERS.items() if k.lower().encode() not in present
                ]
                message = {**message, "headers": headers}
            await send(message)

        if self.host_names is not None:
            host = Headers(scope=scope).get("host")
            # HTTP/1.0 may come without a Host header; browsers always send one, so no DNS rebinding is at stake
            unnamed = host is None and scope["http_version"] == "1.0"
            host = host or ""
            if not unnamed and not host_allowed(host, self.host_names):
                address, port = scope.get("server") or ("127.0.0.1", 8000)
                shown = f"[{address}]" if ":" in address else address
                message = (
                    f"this server answers only requests addressed to localhost or a loopback address, not "
                    f"{host[:80]!r} (a defence against DNS rebinding); open http://{shown}:{port}/"
                )
                await refusal(message, 400)(scope, receive, send_secured)
                return

        def enter() -> None:  # the request has arrived whole: it takes a place, if there is one
            nonlocal counted, held
            if self.active >= self.limits.max_active:
                raise self.busy()
            self.active += 1
            counted = held = True

        async def receive_counted() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False) and not counted:
                enter()  # a RequestError here reaches the handler reading the body, then Guard or the page
            return message

        try:
            if not has_body(scope):
                enter()
            await self.app(scope, receive_counted, send_secured)
        except RequestError as e:
            if not started:
                await refusal(str(e), e.status)(scope, receive, send_secured)
        except Exception as e:  # a bug; a reply already begun ends cut short (the server closes the connection)
            message = report_bug(e, f"{scope['method']} {scope['path']}")
            if not started:
                await refusal(message, 500)(scope, receive, send_secured)
        finally:
            leave()
