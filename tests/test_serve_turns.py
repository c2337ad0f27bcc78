"""nmt-serve's connection layer serves pipelined requests a few at a time (nmt/serve/turns.py), on a real server.

    python -m pytest -q tests/test_serve_turns.py

Without turns, 300 connections that pipeline thousands of requests and never read, each replaced when the server
closes it, left a normal request none within 1 s (a median of 8.9 s, docs/serve_flood_before_lanes.json): each of
them had a request in progress every few steps of the event loop, and a normal request waited for all of them at
each of its own steps.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from nmt.serve.connections import ConnectionLimits, make_server
from nmt.serve.turns import PIPELINED_TURNS, Turns


@contextmanager
def serving(app, limits: ConnectionLimits | None = None) -> Iterator[tuple[int, object]]:
    """`app` behind nmt-serve's connection layer on a free port of 127.0.0.1, in a thread; yields (port, uvicorn
    server). tests/test_serve.py serves the app itself this way."""
    server = make_server(app, limits or ConnectionLimits())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    try:
        yield sock.getsockname()[1], server
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_turns_go_to_the_connections_waiting_longest_and_never_past_the_width():
    turns = Turns(2)
    assert turns.enter("a", lambda: None) and turns.enter("b", lambda: None)
    assert not turns.enter("c", lambda: "c") and not turns.enter("d", lambda: "d")
    assert turns.enter("a", lambda: None)  # one that has a turn keeps it until it leaves
    assert [go() for go in turns.leave("a")] == ["c"]
    assert turns.leave("d") == [] and turns.leave("b") == []  # d left while waiting: its turn never comes
    assert turns.serving == {"c"} and not turns.waiting


def test_pipelined_requests_are_served_a_few_at_a_time_across_connections():
    """12 connections each pipeline 20 requests (and read their replies): every request is answered, and at no
    moment are more than PIPELINED_TURNS of the requests that came after a connection's first in progress."""
    seen: Counter = Counter()  # requests so far, per connection (its client port)
    state = {"now": 0, "most": 0}

    async def app(scope, receive, send):
        assert scope["type"] == "http"
        port = scope["client"][1]
        seen[port] += 1
        later = seen[port] > 1  # a connection's first request is never held back
        state["now"] += later
        state["most"] = max(state["most"], state["now"])
        await asyncio.sleep(0.01)  # each request takes a few steps of the event loop
        state["now"] -= later
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    request, copies = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 20
    with serving(app) as (port, _):
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
        for c in clients:
            c.sendall(request * copies)
        for c in clients:  # every reply arrives (the clients read: none is put on hold)
            c.settimeout(30)
            got = b""
            while got.count(b"HTTP/1.1 200 OK") < copies:
                data = c.recv(65536)
                assert data, f"closed after {got.count(b'HTTP/1.1 200 OK')} replies"
                got += data
            c.close()
    assert sum(seen.values()) == 12 * copies
    assert 1 <= state["most"] <= PIPELINED_TURNS, state  # without turns: all 12 connections at once


def test_requests_refused_before_the_app_are_logged_once_a_minute_and_each_answered():
    """uvicorn wrote a warning for every request it could not read: four clients sending bodies in 1-byte chunks
    made some 20 a second, and each write cost the busy event loop more than the refusal."""

    async def app(scope, receive, send):  # never reached
        raise AssertionError(scope)

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    with serving(app) as (port, _):
        logger = logging.getLogger("uvicorn.error")  # uvicorn has configured it by now
        logger.addHandler(handler)
        try:
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", port)) as c:
                    c.sendall(b"NOT HTTP\r\n\r\n")
                    c.settimeout(10)
                    assert c.recv(65536).startswith(b"HTTP/1.1 400 Bad Request")
        finally:
            logger.removeHandler(handler)
    refused = [line for line in lines if "Invalid HTTP request received" in line]
    assert len(refused) == 1 and "one line a minute" in refused[0], lines
