"""How nmt-serve reads a request's framing: h11's server side, made strict where h11 leaves it to the server.

    conn = StrictConnection(max_header_bytes=16384, max_chunks=256, seen=look)   # for h11.Connection(h11.SERVER)
    event = conn.next_event()      # as h11's; a request head past the limit raises Refusal (431)

StrictConnection (nmt/serve/connections.py uses it) adds what RFC 9112 asks of a server and h11 does not do:
  - a request line and headers over max_header_bytes are refused (431) however the bytes arrive: h11 limits only
    a head it has not yet seen whole, so a head of any size that arrived in one read went through;
  - a request with both Transfer-Encoding and Content-Length is read by its Transfer-Encoding (as h11 reads it),
    handed on without the Content-Length and with Connection: close, so its connection closes after the answer
    (section 6.3: such a request may be an attempt at request smuggling);
  - a chunked body in more than max_chunks chunks is refused (400, and the connection closed): h11 parses
    each chunk in Python (about 15 us), so a 64 KiB body in 1-byte chunks cost a second of the event loop,
    some 180 times the same body with Content-Length; past the bound the rest is never parsed;
  - an absolute-form target (GET http://127.0.0.1:8000/api/models HTTP/1.1, as clients send to a proxy) is
    handed on as its path, and the target's host replaces the Host header (section 3.2.2);
  - a refusal keeps its status and the message for the client (`refusal`), for the JSON reply.
`seen(event)` is called with every event handed on; it may raise Refusal to refuse a request (status, message).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import h11

MALFORMED = "malformed HTTP request; send HTTP/1.1, e.g. with curl or a browser"
ABSOLUTE_FORM = re.compile(rb"https?://", re.IGNORECASE)


class Refusal(h11.RemoteProtocolError):
    """A request refused before the app sees it: str(e) is the message for the client, error_status_hint the
    status."""


def head_too_large(limit: int) -> Refusal:
    return Refusal(f"the request line and headers are over {limit:,} bytes", error_status_hint=431)


def too_many_chunks(limit: int) -> Refusal:
    return Refusal(
        f"the chunked body came in more than {limit:,} chunks; send it with Content-Length, or in fewer, larger chunks",
        error_status_hint=400,
    )


def origin_form(event: h11.Request) -> h11.Request:
    """The request as the app should see it: an absolute-form target as its path, with the target's host as the
    Host header; Transfer-Encoding with Content-Length as Transfer-Encoding alone, with Connection: close."""
    headers = list(event.headers)  # (lower-case name, value)
    names = {name for name, _ in headers}
    target, changed = event.target, False
    if b"transfer-encoding" in names and b"content-length" in names:
        headers = [(name, value) for name, value in headers if name != b"content-length"]
        headers.append((b"connection", b"close"))
        changed = True
    if ABSOLUTE_FORM.match(target):
        parts = urlsplit(target)
        target = (parts.path or b"/") + (b"?" + parts.query if parts.query else b"")
        headers = [(name, value) for name, value in headers if name != b"host"] + [(b"host", parts.netloc)]
        changed = True
    if not changed:
        return event
    return h11.Request(method=event.method, target=target, headers=headers, http_version=event.http_version)


class StrictConnection(h11.Connection):
    """h11's server side with the checks above; `refusal` is (status, message) of the last protocol error."""

    def __init__(self, max_header_bytes: int, max_chunks: int, seen: Callable[[Any], None]):
        super().__init__(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.max_header_bytes, self.max_chunks, self.seen = max_header_bytes, max_chunks, seen
        self.refusal = (400, MALFORMED)
        self.chunks = 0  # chunks of the current request's body so far

    def buffered(self) -> int:
        """Bytes received and not yet parsed: after a whole request, the start of one sent before its reply."""
        return len(self._receive_buffer)

    def next_event(self) -> Any:
        # the bytes h11 holds unparsed (its receive buffer has no public size); a Request event took its head out
        buffered = len(self._receive_buffer)
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                if buffered - len(self._receive_buffer) > self.max_header_bytes:
                    raise head_too_large(self.max_header_bytes)
                event = origin_form(event)
                self.chunks = 0
            elif isinstance(event, h11.Data) and event.chunk_start:
                self.chunks += 1
                if self.chunks > self.max_chunks:
                    raise too_many_chunks(self.max_chunks)
            self.seen(event)
        except Refusal as e:
            self.refusal = (e.error_status_hint, str(e))
            raise
        except h11.RemoteProtocolError as e:  # h11's own: a head still incomplete past the limit, or malformed
            status = e.error_status_hint
            self.refusal = (431, str(head_too_large(self.max_header_bytes))) if status == 431 else (400, MALFORMED)
            raise
        return event
