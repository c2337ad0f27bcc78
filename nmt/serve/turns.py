"""Pipelined requests served in turn: at most a few at once across all connections (nmt/serve/connections.py).

    turns = Turns(PIPELINED_TURNS)
    if turns.enter(conn, go):     # a request this connection sent before the reply to its last one: serve it now?
        go()                      # yes; else turns.leave returns go once a turn is free for it
    ...
    for go in turns.leave(conn):  # its reply is complete, or it closed: the connections waiting longest get turns
        loop.call_soon(go)

A request that a connection sends before the reply to its previous one has left (pipelining, which no browser
does) is served only on a turn, in order of asking. The event loop runs every ready step in order, so with 300
connections that each pipeline thousands of requests and never read, each of them had a request in progress
every few steps: a normal request waited for a few hundred other steps at each of its own (accepting,
reading, handing to the app, waking when its translation was done, writing), seconds on a busy machine. With at
most PIPELINED_TURNS of them in progress, it waits for a few. A connection that sends its next request after its
reply (a browser, curl) never waits for a turn, and nor does any connection's first request.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

PIPELINED_TURNS = 4  # pipelined requests in progress at once, all connections together


class Turns:
    """Who may serve a pipelined request now (at most `width` connections), and who waits, first come first served.
    Touched by the event loop only; `go` callbacks are called by the caller of `leave`, never inside `enter`."""

    def __init__(self, width: int = PIPELINED_TURNS):
        if width < 1:
            raise ValueError(f"pipelined turns must be at least 1, not {width}")
        self.width = width
        self.serving: set[Hashable] = set()
        self.waiting: dict[Hashable, Callable[[], None]] = {}  # in order of asking

    def enter(self, conn: Hashable, go: Callable[[], None]) -> bool:
        """Whether `conn` has a turn now; if not, it waits, and `go` is returned by `leave` when its turn comes."""
        if conn in self.serving:
            return True
        if len(self.serving) < self.width:
            self.serving.add(conn)
            return True
        self.waiting.setdefault(conn, go)
        return False

    def leave(self, conn: Hashable) -> list[Callable[[], None]]:
        """`conn` is done with its turn (or gone, waiting or not); the `go` of each connection whose turn came."""
        self.waiting.pop(conn, None)
        self.serving.discard(conn)
        came = []
        while self.waiting and len(self.serving) < self.width:
            nxt = next(iter(self.waiting))
            came.append(self.waiting.pop(nxt))
            self.serving.add(nxt)
        return came
