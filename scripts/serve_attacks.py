"""Clients of scripts/serve_flood.py that read their replies slowly or never, and a burst of clients at once.

    attackers, measured = slow_readers(port, slow=66, never=66, copies=3000, rate=15000, during=normal_client)
    outcomes = burst(port, clients=300, each=3, request=b"POST /translate HTTP/1.1\\r\\n...")
    attackers, measured = pages_and_chunks(port, pages=6, chunkers=4, text=words_150, during=normal_client)
    attackers, measured = reconnecting(port, clients=300, copies=3000, during=normal_client)

slow_readers opens `slow` connections that pipeline `copies` GET /static/serve.js (about 6 KB a reply) at once
and read about `rate` bytes a second, and `never` that pipeline the same and never read; it runs `during()`
meanwhile (a normal client) and says, per kind, how many the server cut and when (seconds after opening).
burst starts `clients` threads at once, each sending `each` requests one after another, each on a new
connection (Connection: close), and counts what came back: a status line, a reset, or a close without reply.
pages_and_chunks runs `pages` clients that each POST the page's form with `text` (a self-attention checkpoint's
page is the largest reply there is), never read it, and ask again on a new connection once the reply has begun,
and `chunkers` that each send POST /translate with {"text": "bimi raka" + 65,000 spaces} in 1-byte chunks, again
and again, each on a new connection. reconnecting keeps `clients` connections that each pipeline `copies`
GET /static/serve.js and never read, opening a new one whenever the server closes one.
Linux: a never-reading connection's end is read from TCP_INFO (the kernel's state of the socket).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from urllib.parse import urlencode

STATIC = b"GET /static/serve.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
TCP_ESTABLISHED = 1  # the first byte of struct tcp_info: the socket's state


def pipelining(port: int, copies: int) -> socket.socket:
    """A connection that sends `copies` GET /static/serve.js at once, from a thread (the server reads them as it
    answers); the thread ends when all are sent or the server cuts the connection."""
    sock = socket.create_connection(("127.0.0.1", port))

    def send() -> None:
        with suppress(OSError):
            sock.sendall(STATIC * copies)

    threading.Thread(target=send, daemon=True).start()
    return sock


def established(sock: socket.socket) -> bool:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_ESTABLISHED


def seconds_summary(times: list[float]) -> dict | None:
    if not times:
        return None
    return {"min": round(min(times), 1), "median": round(statistics.median(times), 1), "max": round(max(times), 1)}


def beside(work: Callable[[], None], stop: threading.Event, during: Callable[[], dict]) -> dict:
    """`work()` in a thread while `during()` runs; then `stop` is set and the thread joined."""
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    measured = during()
    stop.set()
    worker.join()
    return measured


def page_once(port: int, text: str) -> dict:
    """POST / with `text`, read whole: its status, size, time, cells drawn and maps drawn coarser."""
    body = urlencode({"text": text, "beam": "1"})
    began = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/", body, {"Content-Type": "application/x-www-form-urlencoded"})
        reply = conn.getresponse()
        page = reply.read()
    finally:
        conn.close()
    return {
        "status": reply.status,
        "bytes": len(page),
        "seconds": round(time.perf_counter() - began, 2),
        "cells": page.count(b'class="cell"'),
        "notes_drawn_coarser": page.count(b'class="note coarse"'),
    }


def slow_readers(
    port: int, slow: int, never: int, copies: int, rate: float, during: Callable[[], dict]
) -> tuple[dict, dict]:
    """Open the attackers, run `during()` meanwhile, then close them; (what the server did to each kind, what
    `during` returned)."""
    kinds = {kind: [pipelining(port, copies) for _ in range(n)] for kind, n in (("slow", slow), ("never", never))}
    opened, cut, read = time.monotonic(), {}, Counter()
    stop = threading.Event()

    def watch() -> None:  # every 0.1 s: each slow reader reads rate / 10 bytes; a cut one reads b"" or a reset
        while not stop.is_set():
            for sock in kinds["slow"]:
                if sock in cut:
                    continue
                try:
                    data = sock.recv(max(1, int(rate / 10)))
                except OSError:
                    data = b""
                read[sock] += len(data)
                if not data:
                    cut[sock] = time.monotonic() - opened
            for sock in kinds["never"]:
                if sock not in cut and not established(sock):
                    cut[sock] = time.monotonic() - opened
            time.sleep(0.1)

    measured = beside(watch, stop, during)
    lasted = time.monotonic() - opened
    summary = {}
    for kind, socks in kinds.items():
        summary[kind] = {
            "connections": len(socks),
            "cut_by_the_server": sum(s in cut for s in socks),
            "cut_after_s": seconds_summary([cut[s] for s in socks if s in cut]),
            "held_s": round(lasted, 1),
        }
        if kind == "slow" and socks:  # each one's rate while it was open
            rates = [read[s] / cut.get(s, lasted) / 1000 for s in socks]
            summary[kind]["read_kb_per_s_median"] = round(statistics.median(rates), 1)
        for sock in socks:
            sock.close()
    return summary, measured


def one_request(port: int, request: bytes) -> str:
    """What came back for `request` on a new connection: its status line, and for a refusal the start of its
    {"error": ...} with numbers as N ("HTTP/1.1 503 Service Unavailable: busy: N requests are being
    translated"), or "reset", or "closed without reply"."""
    sock = socket.socket()
    try:
        sock.settimeout(60)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        said = b""
        while data := sock.recv(65536):
            said += data
    except ConnectionResetError:
        return "reset"
    except OSError as e:
        return type(e).__name__
    finally:
        sock.close()
    head, _, body = said.partition(b"\r\n\r\n")
    if not head:
        return "closed without reply"
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    try:
        error = json.loads(body).get("error")
    except ValueError:
        return f"{status} (not JSON)"
    return f"{status}: {re.sub(r'[0-9]+', 'N', error.split(';')[0])}" if error else status


def burst(port: int, clients: int, each: int, request: bytes) -> dict:
    """`clients` threads released at once, each sending `request` `each` times, one after another."""
    outcomes, lock, start = Counter(), threading.Lock(), threading.Barrier(clients)

    def client() -> None:
        start.wait()
        for _ in range(each):
            said = one_request(port, request)
            with lock:
                outcomes[said] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "clients": clients,
        "requests_each": each,
        "seconds": round(time.monotonic() - began, 1),
        "outcomes": dict(outcomes.most_common()),
    }


def _alive(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets the server has not closed; the others are closed here."""
    kept = []
    for sock in socks:
        try:
            up = established(sock)
        except OSError:
            up = False
        if up:
            kept.append(sock)
        else:
            sock.close()
    return kept


def page_reader(port: int, text: str, stop: threading.Event, counts: Counter, lock: threading.Lock) -> None:
    """POST / with `text`, never read, again on a new connection once the reply has begun (or after 30 s)."""
    body = "text=" + "+".join(text.split()) + "&beam=1"
    request = (
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    held: list[socket.socket] = []
    while not stop.is_set():
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(request)
        sock.settimeout(30)
        with suppress(OSError):  # the reply has begun: leave it unread
            sock.recv(1, socket.MSG_PEEK)
        held = _alive(held) + [sock]
        with lock:
            counts["pages asked"] += 1
            counts["held at most"] = max(counts["held at most"], len(held))
    for sock in held:
        sock.close()


def chunker(port: int, stop: threading.Event, counts: Counter, lock: threading.Lock) -> None:
    """POST /translate with {"text": "bimi raka" + 65,000 spaces} in 1-byte chunks (100 to a write), again and
    again on new connections: what the server answered each time."""
    body = b'{"text": "bimi raka"' + b" " * 65000 + b"}"
    head = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    chunks = [b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))] + [b"0\r\n\r\n"]
    writes = [b"".join(chunks[i : i + 100]) for i in range(0, len(chunks), 100)]
    while not stop.is_set():
        sock = socket.create_connection(("127.0.0.1", port))
        said = b""
        try:
            sock.sendall(head)
            for data in writes:
                sock.sendall(data)
            sock.settimeout(30)
            while data := sock.recv(65536):
                said += data
        except OSError:
            with suppress(OSError):
                said += sock.recv(65536)
        finally:
            sock.close()
        status = said.split(b"\r\n", 1)[0].decode("latin-1") or "closed without reply"
        with lock:
            counts[status] += 1


def pages_and_chunks(port: int, pages: int, chunkers: int, text: str, during: Callable[[], dict]) -> tuple[dict, dict]:
    """The page readers and the chunkers (module docstring) while `during()` runs; (what they saw, its result)."""
    stop, lock, page_counts, chunk_counts = threading.Event(), threading.Lock(), Counter(), Counter()
    threads = [threading.Thread(target=page_reader, args=(port, text, stop, page_counts, lock)) for _ in range(pages)]
    threads += [threading.Thread(target=chunker, args=(port, stop, chunk_counts, lock)) for _ in range(chunkers)]
    for t in threads:
        t.start()
    measured = during()
    stop.set()
    for t in threads:
        t.join()
    attackers = {
        "page_readers": {"clients": pages, "words": len(text.split()), **page_counts},
        "chunkers": {"clients": chunkers, "body_bytes": 65021, "answers": dict(chunk_counts.most_common())},
    }
    return attackers, measured


def reconnecting(port: int, clients: int, copies: int, during: Callable[[], dict]) -> tuple[dict, dict]:
    """`clients` never-reading pipeliners, each replaced by a new one when the server closes it, while `during()`
    runs; (how many the server closed, its result)."""
    stop, reopened = threading.Event(), Counter()
    socks = [pipelining(port, copies) for _ in range(clients)]

    def keep() -> None:  # every 0.1 s: a closed one is replaced
        while not stop.is_set():
            for i, sock in enumerate(socks):
                if _alive([sock]):
                    continue
                try:
                    socks[i] = pipelining(port, copies)
                except OSError:  # not accepted now: tried again in 0.1 s
                    continue
                reopened["closed by the server and reopened"] += 1
            time.sleep(0.1)

    measured = beside(keep, stop, during)
    for sock in socks:
        sock.close()
    return {"connections": clients, "pipeline": copies, **reopened}, measured
