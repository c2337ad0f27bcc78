"""The HTTP connection layer of nmt-serve: uvicorn's h11 protocol with deadlines and a connection cap.

    server = make_server(create_app(models, examples, limits), ConnectionLimits())
    server.run(sockets=[sock])                        # nmt/cli/serve.py binds and listens; tests run it in a thread

uvicorn alone lets idle and slow clients starve the others: its keep-alive timer starts only after a first
reply (a connection that sends nothing, or half its headers, stays open for ever), and its limit_concurrency
counts idle connections, so some 60 silent connections answer everyone else 503. GuardedProtocol, a subclass
of uvicorn's H11Protocol (the pure-Python HTTP/1.1 protocol; used whatever else is installed), adds:
  - a read deadline: a request's headers and body must arrive within ConnectionLimits.read_timeout of its
    first byte; past it the client gets 408 and the connection is closed (a reply already sent: just closed);
  - an idle deadline: a connection that sends nothing is closed after idle_timeout, as uvicorn closes one
    that sends nothing after a reply (timeout_keep_alive, the same value);
  - a send deadline: once a connection's replies fill the server's send buffer (the client reads slower than
    it asks, or not at all), or it pipelines while the kernel still holds a reply it has not taken (then its
    next request waits: on hold), it has write_timeout to read all that is queued, replies to the requests it
    pipelined meanwhile included; reading a little does not restart the clock, and past it the connection is
    cut. (The app gives a request's place back once its reply is ready: nmt.serve.guard.Guard.)
  - turns for pipelined requests (nmt/serve/turns.py): a request sent before the reply to the one before it is
    served only on one of PIPELINED_TURNS turns, shared by every connection, so pipeliners leave the event loop
    time for everyone else;
  - a connection cap: past max_connections open connections, the longest-idle ones with nothing to read (no
    request in progress, none waiting unread in the kernel) are closed to make room, then the ones that have
    left their replies unread for longest: those whose send deadline runs, longest first, then those that
    pipeline (a next request sent before the reply to the one in progress, as no browser does), oldest first
    (every local client shares 127.0.0.1, so a bound by address would not help); if there are too few, the
    newcomer is answered 503 once its request has arrived, never closed before it is read. Making room asks the
    kernel (a system call) only about connections that might be idle, never about one on hold or waiting for a
    turn: asking about all 256, and sorting them, for every newcomer took most of the event loop's time under
    300 reconnecting clients;
  - strict framing (nmt/serve/framing.py): heads over max_header_bytes get 431 however they arrive, a chunked
    body in more than max_chunks chunks 400 (both close the connection), a request
    with both Content-Length and Transfer-Encoding is answered and its connection closed, and an absolute-form
    target is served as its path;
  - refusals in the documented JSON with the security headers (nmt.serve.guard.HEADERS): 408, 503, and a
    malformed request (400) or headers over max_header_bytes (431) instead of uvicorn's plain text, and
    uvicorn's warning for each of the latter at most once a minute (nmt/serve/refusal_log.py).
The cap on requests in progress is the app's (Limits.max_active, nmt.serve.guard.Guard): it counts requests,
never connections. The subclass relies on H11Protocol's attributes (conn, cycle, transport, connections, flow);
tests/test_serve.py checks every behaviour above against a real server.
"""

from __future__ import annotations

import array
import asyncio
import heapq
import json
import socket
import struct
from contextlib import suppress
from dataclasses import dataclass
from http import HTTPStatus
from itertools import islice
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from nmt.serve.app import read_timeout_message
from nmt.serve.framing import Refusal, StrictConnection
from nmt.serve.guard import HEADERS
from nmt.serve.refusal_log import RefusalCounts, RefusalLog
from nmt.serve.turns import Turns

try:  # how many bytes wait in the kernel, unread or untaken (Linux); elsewhere the cap and the hold do not look
    from fcntl import ioctl
    from termios import FIONREAD, TIOCOUTQ
except ImportError:  # pragma: no cover
    ioctl = None

ABORT_AFTER = 1.0  # seconds a closed connection may take to flush its last reply before it is cut
# the kernel's send buffer of a connection (Linux doubles it for its bookkeeping), fixed instead of grown up to
# 4 MiB: a client that does not read holds that little memory, and its replies back up into the server's own
# buffer, where the send deadline sees them, within 256 KiB instead of megabytes (minutes at 15 KB/s)
KERNEL_SEND_BUFFER = 128 * 1024
HOLD_POLL = (0.05, 1.0)  # seconds between looks at the send queue of a connection on hold: first, doubling to


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold; each has a command-line option in nmt-serve."""

    read_timeout: float = 10.0  # seconds from a request's first byte to its last (headers and body); then 408
    idle_timeout: float = 5.0  # seconds a connection may send nothing: after it opens, and between requests
    write_timeout: float = 10.0  # seconds to read a backlog of replies, from when it fills the send buffer; then cut
    max_connections: int = 256  # open connections; past it the longest-idle (or longest unread) one is closed
    max_header_bytes: int = 16384  # a request line and headers over this: 431
    max_chunks: int = 256  # chunks of a chunked body (so they average 256 bytes at the 64 KiB limit); more: 400


def raw_refusal(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response {"error": message} with the security headers, for a connection about to close."""
    body = json.dumps({"error": message}, ensure_ascii=False, separators=(",", ":")).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name.lower()}: {value}" for name, value in HEADERS.items()),
    ]
    return "\r\n".join([*lines, "", ""]).encode("latin-1") + body


class GuardedProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the deadlines and the connection cap of ConnectionLimits."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    turns: ClassVar[Turns] = Turns()  # make_server gives each server its own, and its own refusal counts
    refusals: ClassVar[RefusalCounts] = RefusalCounts()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.logger = RefusalLog(self.logger, self.refusals)  # uvicorn's line per refused request: one a minute
        self.conn = StrictConnection(self.limits.max_header_bytes, self.limits.max_chunks, self._seen)
        self.reading = False  # a request's first byte has arrived, its last not yet
        self.since = self.loop.time()  # when it opened or began its latest request: the eviction order
        self.over_cap = False  # opened past max_connections: its request gets 503 unless room is made by then
        self.deadline: asyncio.TimerHandle | None = None  # the read or idle deadline
        self.write_deadline: asyncio.TimerHandle | None = None
        self.hold_poll = HOLD_POLL[0]  # seconds until the next look at a connection on hold

    @property
    def busy(self) -> bool:
        """A request in progress: read whole, its reply not yet complete (a body on its way is not progress)."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and self.conn.their_state is not h11.SEND_BODY

    def unread(self) -> int:
        """Bytes the client sent that wait in the kernel, unread (a request that came with a burst of others)."""
        return self._kernel_count(FIONREAD) if ioctl is not None else 0

    def untaken(self) -> int:
        """Bytes of replies the kernel still holds (the client's receive buffer is full: it does not read)."""
        return self._kernel_count(TIOCOUTQ) if ioctl is not None else 0

    def _kernel_count(self, request: int) -> int:
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return 0
        count = array.array("i", [0])
        try:
            ioctl(sock.fileno(), request, count)
        except OSError:
            return 0
        return count[0]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):  # the client may be gone already
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, KERNEL_SEND_BUFFER)
        self._arm(self.limits.idle_timeout)
        self.over_cap = not self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave_turn()
        self._disarm()
        if self.write_deadline is not None:
            self.write_deadline.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and not self.reading:
            self.reading, self.since = True, self.loop.time()
            self._arm(self.limits.read_timeout)
        super().data_received(data)

    def _seen(self, event: object) -> None:
        if isinstance(event, h11.Request) and self.over_cap:  # opened past the cap: is there room now?
            if not self._make_room():
                open_ = sum(not c.transport.is_closing() for c in self.connections)
                raise Refusal(
                    f"too many connections: {open_} are open, none idle or leaving its replies unread; try again "
                    "in a moment",
                    error_status_hint=503,
                )
            self.over_cap = False
        if isinstance(event, h11.EndOfMessage):  # the request is read: no deadline while the app works on it
            self.reading = False
            self._disarm()

    def on_response_complete(self) -> None:
        """uvicorn's next step after a reply. A connection that pipelines while the kernel still holds a reply it
        has not taken is put on hold: its next request waits (looked at after HOLD_POLL[0] s, then twice as long
        each time up to HOLD_POLL[1]) and its send deadline runs, so a client that never reads costs the server
        a few replies, not the dozens its buffers hold, and little more while it waits to be cut. Otherwise a
        pipelined request is served on a turn (nmt/serve/turns.py), so that a few of them at most are in progress
        at once, all connections together, and the event loop keeps time for the others."""
        self._leave_turn()
        pipelined = not self.transport.is_closing() and (self.conn.buffered() or self.unread())
        if not pipelined:
            self.hold_poll = HOLD_POLL[0]
            super().on_response_complete()
            return
        if not self.untaken():
            self.hold_poll = HOLD_POLL[0]
            if self.turns.enter(self, self._turn_came):
                self._turn_came()
            return
        if self.write_deadline is None:
            self.write_deadline = self.loop.call_later(self.limits.write_timeout, self._write_deadline_passed)
        self.loop.call_later(self.hold_poll, self.on_response_complete)
        self.hold_poll = min(2 * self.hold_poll, HOLD_POLL[1])

    def _turn_came(self) -> None:
        if self.transport.is_closing():
            self._leave_turn()
            return
        super().on_response_complete()
        if not self.busy:  # no next request read whole (its head or body still to come): the turn is not needed
            self._leave_turn()

    def _leave_turn(self) -> None:
        for go in self.turns.leave(self):
            self.loop.call_soon(go)

    def send_400_response(self, msg: str) -> None:
        """A request refused before the app (malformed, a head too large, no room) or while its body arrives (too
        many chunks): the JSON refusal, then close; an app waiting for the body hears that the client left."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self._refuse(*self.conn.refusal)

    def pause_writing(self) -> None:  # the send buffer is full: the client has write_timeout to read it all
        super().pause_writing()
        if self.write_deadline is None:
            self.write_deadline = self.loop.call_later(self.limits.write_timeout, self._write_deadline_passed)

    def resume_writing(self) -> None:
        if self.write_deadline is not None and not self.busy:  # read, and no pipelined reply waits to be sent
            self.write_deadline.cancel()
            self.write_deadline = None
        super().resume_writing()

    def _write_deadline_passed(self) -> None:
        self.write_deadline = None
        # still behind (replies queued, untaken, or requests pipelined meanwhile): its replies are dropped
        if self.transport.get_write_buffer_size() or self.untaken() or self.conn.buffered() or self.unread():
            self._cut()

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's idle close, cut after ABORT_AFTER if the client does not read the last reply."""
        if not self.transport.is_closing():
            self._close()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(seconds, self._deadline_passed)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _deadline_passed(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        working = cycle is not None and not cycle.response_complete  # the app has the request (maybe not its body)
        if not self.reading:  # a connection that sent nothing since it opened
            if not working:
                self._close()
            return
        if self.busy:  # this request is read; a pipelined next one waits its turn
            self._arm(self.limits.read_timeout)
            return
        answered = cycle is not None and cycle.response_started and self.conn.their_state is h11.SEND_BODY
        if working:  # the app, waiting for the body, hears that the client left; its reply goes nowhere
            cycle.disconnected = True
            cycle.message_event.set()
        if answered:  # the reply went out before the rest of the body, which never came
            self._close()
        else:
            self._refuse(408, read_timeout_message(self.limits.read_timeout))

    def _make_room(self) -> bool:
        """Past max_connections, close the longest-idle connections with nothing to read, then cut those that have
        left their replies unread for longest (their send deadline is running), then those that pipeline; whether
        there is room now. A connection whose request still waits unread in the kernel is not idle (it came in the same
        burst), and one whose client waits for the reply to its request in progress, nothing sent after, is kept."""
        others = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        excess = len(others) + 1 - self.limits.max_connections
        if excess <= 0:
            return True
        guarded = [c for c in others if isinstance(c, GuardedProtocol)]
        # one whose send deadline runs, or that waits for a turn, has a next request: not idle (no system call to ask)
        quiet = (c for c in guarded if not c.busy and c.write_deadline is None and c not in self.turns.waiting)
        idle = list(islice((c for c in sorted(quiet, key=lambda c: c.since) if not c.unread()), excess))
        for c in idle:
            c._close()
        need = excess - len(idle)
        rest = [c for c in guarded if c not in idle] if need else []
        cut = heapq.nsmallest(need, (c for c in rest if c.unread_since is not None), key=lambda c: c.unread_since)
        if len(cut) < need:
            pipelining = (c for c in rest if c.unread_since is None and c.pipelining())
            cut += heapq.nsmallest(need - len(cut), pipelining, key=lambda c: c.since)
        for c in cut:
            c._cut()
        return len(idle) + len(cut) >= excess

    def pipelining(self) -> bool:
        """Its request is read whole and more bytes wait behind it (the next request, sent before this reply), or
        its next request waits for a turn."""
        if self in self.turns.waiting:
            return True
        done = self.busy and self.conn.their_state in (h11.DONE, h11.MUST_CLOSE)
        return done and (self.conn.buffered() > 0 or self.unread() > 0)

    @property
    def unread_since(self) -> float | None:
        """When this connection's replies backed up unread (its send deadline began), or None."""
        deadline = self.write_deadline
        return None if deadline is None else deadline.when() - self.limits.write_timeout

    def _refuse(self, status: int, message: str) -> None:
        self.transport.write(raw_refusal(status, message))
        self._close()

    def _close(self) -> None:
        self._disarm()
        self.transport.close()
        self.loop.call_later(ABORT_AFTER, self._cut)  # if the client does not read the last reply

    def _cut(self) -> None:
        """Close now, dropping what the client has not read, the kernel's copy too (a reset, not a FIN)."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.fileno() != -1:  # -1: closed already, all sent
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


def make_server(app: Any, limits: ConnectionLimits, **options: Any) -> uvicorn.Server:
    """A uvicorn server of `app` whose connections follow `limits` (options: more uvicorn.Config settings)."""
    shared = {"limits": limits, "turns": Turns(), "refusals": RefusalCounts()}  # this server's connections share
    protocol = type("GuardedProtocol", (GuardedProtocol,), shared)
    config = uvicorn.Config(
        app,
        http=protocol,
        ws="none",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]  (a float works: it goes to call_later)
        limit_concurrency=None,  # it would count idle connections; the app caps requests in progress instead
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_graceful_shutdown=5,
        **options,
    )
    return uvicorn.Server(config)
