"""nmt-serve: compare checkpoints in the browser, their translations and attention side by side.

    nmt-serve none/checkpoints/best.pt luong/checkpoints/best.pt          # then open http://127.0.0.1:8000/
    nmt-serve best.pt --port 0                                            # any free port (the URL is printed)
    curl -s localhost:8000/translate -d '{"text": "ein Test .", "beam": 5}'

Loads every checkpoint once, then serves the page and its JSON API (nmt/serve/app.py) with uvicorn on
loopback, behind deadlines and a connection cap for idle and slow clients (nmt/serve/connections.py). Free
of Hydra, like nmt-translate; torch is imported only after the arguments are checked and the port is bound,
so `--help` and a port in use are answered at once.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import os
import socket
import sys
import time

EPILOG = """the page:
  a text box, greedy or beam 5, example sentences from the test split of the first checkpoint's corpus
  (when its data cache is found; otherwise a few built-in ones), and for every checkpoint its translation,
  its attention settings and a heatmap (hover a cell, or an output piece); attention=none has no heatmap.

the JSON API (also usable without the page):
  POST /translate   {"text": "...", "beam": 5}  ->  {"text", "beam", "notes", "truncated", "results": [
                    {"label", "checkpoint", "hypothesis", "src_pieces", "tgt_pieces", "weights",
                     "has_alignment", "time", "note"}, ...]}      (one result per checkpoint, in order)
  GET  /api/models  the checkpoints' labels and settings, the limits, the example sentences
  Every refusal is {"error": "..."} with status 400 (bad input, a foreign Host header, malformed HTTP),
  404/405 (wrong path or method), 408 (too slow to arrive), 413 (body too large), 431 (headers too large),
  503 (busy or too slow) or 500 (a bug: the reply names an id, the server log has it with the traceback).

limits:
  a text over --max-chars characters, or over --max-pieces source pieces, is cut there and the reply
  says so; a request waits at most --timeout seconds. Each checkpoint translates in two worker threads, one
  request at a time in each: short requests (up to 200 characters x beam) in one, longer ones in the other,
  so a short one never waits for a long one; the checkpoints of one request run side by side. Requests a
  client pipelines (sends before the reply to its previous one) are served a few at a time, all clients
  together.
  Slow and idle clients: a request must arrive whole (headers and body) within --read-timeout seconds of
  its first byte (else 408, and the connection is closed); a connection that sends nothing for
  --idle-timeout seconds is closed; a client whose replies fill the server's send buffer has
  --write-timeout seconds to read them all (else the connection is cut); past --max-connections open
  connections the longest-idle one is closed, else the one leaving its replies unread longest, else one that
  pipelines (if there is none, the newcomer's request gets 503); a chunked body may come in 256 chunks; at most
  --max-active requests are in progress at once (more get 503), from their arrival until their reply is
  ready. Idle connections and slow readers never count against --max-active.

examples:
  nmt-serve outputs/none/checkpoints/best.pt outputs/luong/checkpoints/best.pt
  nmt-serve run/checkpoints/best.pt --port 8080 --threads 2
  nmt-serve run/checkpoints/best.pt --host 0.0.0.0    # reachable from other machines: no authentication!
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="nmt-serve",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve a page and a JSON API that translate one sentence with several "
        "nmt checkpoints and show each one's attention.",
    )
    p.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CKPT",
        help="checkpoints written by nmt-train, e.g. <run dir>/checkpoints/best.pt (shown in this order)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)",
    )
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--device", default="auto", help="auto (the default: cuda if any), cpu, cuda, cuda:N")
    p.add_argument(
        "--amp",
        default="auto",
        choices=("auto", "bf16", "off"),
        help="bf16 autocast: auto (the default) where the hardware computes bf16, off for fp32",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads per model call (default: CPU cores / checkpoints, at least 1)",
    )
    p.add_argument(
        "--max-chars",
        type=int,
        default=1000,
        metavar="N",
        help="longest text in characters; longer ones are cut, with a note (default 1000)",
    )
    p.add_argument(
        "--max-pieces",
        type=int,
        default=100,
        metavar="N",
        help="longest source in pieces, end of sentence included; longer ones are cut (default 100)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a request may take, waiting included, before a 503 (default 60)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a request's headers and body may take to arrive, from its first byte; later: 408 and the "
        "connection is closed (default 10)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds a connection may send nothing (after it opens, or between requests) before it is closed "
        "(default 5)",
    )
    p.add_argument(
        "--write-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a client has to read its replies once they fill the server's send buffer (it reads slower "
        "than it asks, or not at all); reading a little does not restart the clock; later the connection is cut "
        "(default 10)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=256,
        metavar="N",
        help="open connections; past it the longest-idle one (no request in progress) is closed (default 256)",
    )
    p.add_argument(
        "--max-active",
        type=int,
        default=64,
        metavar="N",
        help="requests in progress at once, any path (a request counts once it has arrived whole); more are "
        "answered 503 (default 64)",
    )
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        p.error(f"--port {args.port}: use a port from 1 to 65535, or 0 for any free port")
    for name, low in (("threads", 1), ("max_chars", 1), ("max_pieces", 2), ("max_connections", 2), ("max_active", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}")
    for name in ("timeout", "read_timeout", "idle_timeout", "write_timeout"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def is_loopback(sock: socket.socket) -> bool:
    """Whether the socket is bound to a loopback address (127.0.0.0/8, ::1): decided by the address the host
    resolved to, so 127.0.0.2 and any name of this machine's loopback count, and 0.0.0.0 does not."""
    address = sock.getsockname()[0].partition("%")[0]
    return ipaddress.ip_address(address).is_loopback


def enough_files(connections: int) -> int:
    """The connections the process can hold open: raises its open-file limit to `connections` plus room for
    checkpoints, libraries and logs where the hard limit allows, else returns fewer."""
    try:
        import resource
    except ImportError:  # not on Linux/macOS: nothing to raise
        return connections
    room = 128
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + room
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return connections if soft == resource.RLIM_INFINITY else max(2, min(connections, soft - room))


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening; ConfigError with the fix if that is impossible. It listens at
    once, before any model loads: Linux lets two sockets with SO_REUSEADDR bind one port while neither listens,
    so a second nmt-serve started moments after the first would otherwise learn of the clash only at listen(),
    after loading its models. Connections made while the models load wait in the backlog."""
    from nmt.errors import ConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        raise ConfigError(
            f"--host {host}: not an address or name of this machine; use 127.0.0.1 (this machine "
            "only) or 0.0.0.0 (every interface)"
        ) from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{host}:{port} is already in use (another nmt-serve?); stop that program or pick "
                "another port, e.g. --port 8001 (--port 0 picks a free one)"
            ) from None
        if e.errno == errno.EACCES:
            raise ConfigError(
                f"{host}:{port}: ports below 1024 need root; use a higher port, e.g. --port 8000"
            ) from None
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen there ({e.strerror}); use --host 127.0.0.1"
        ) from None
    return sock


def serve(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    sock = bind(args.host, args.port)
    from nmt.device import resolve_device
    from nmt.serve.app import create_app
    from nmt.serve.connections import ConnectionLimits, make_server
    from nmt.serve.examples import find_examples
    from nmt.serve.models import Limits, load_models, set_threads

    set_threads(args.threads or max(1, (os.cpu_count() or 1) // len(args.checkpoints)))
    device = resolve_device(args.device, "--device ")
    models, first = load_models(args.checkpoints, device, args.amp)
    examples = find_examples(first, args.checkpoints[0])
    for m in models:
        print(f"nmt-serve: {m.path}: {m.label}, {m.settings['parameters']:,} parameters", flush=True)
    limits = Limits(
        max_chars=args.max_chars,
        max_pieces=args.max_pieces,
        timeout=args.timeout,
        max_active=args.max_active,
        read_timeout=args.read_timeout,
    )
    loopback = is_loopback(sock)
    # on loopback: only Host headers naming localhost, a loopback address or --host as given (DNS rebinding)
    app = create_app(models, examples, limits, allowed_hosts=[args.host] if loopback else None)
    max_connections = enough_files(args.max_connections)
    if max_connections < args.max_connections:
        print(
            f"nmt-serve: warning: --max-connections {args.max_connections}: the open-file limit allows "
            f"{max_connections}; raise it (ulimit -n) for more",
            file=sys.stderr,
            flush=True,
        )
    connections = ConnectionLimits(
        read_timeout=args.read_timeout,
        idle_timeout=args.idle_timeout,
        write_timeout=args.write_timeout,
        max_connections=max_connections,
    )
    server = make_server(app, connections)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if not loopback:
        where = args.host if args.host == host else f"{args.host} ({host})"
        print(
            f"nmt-serve: warning: listening on {where}: anyone who can reach this machine can use the server "
            "(there is no authentication)",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"nmt-serve: serving {len(models)} checkpoint{'s' if len(models) > 1 else ''} on http://{shown}:{port}/ "
        f"(ready in {time.perf_counter() - started:.1f} s; Ctrl-C stops)",
        flush=True,
    )
    server.run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(format="nmt-serve: %(levelname)s: %(message)s", level=logging.WARNING)
    # the reply reports cut sources as notes; the Translator's own warning ("line 1: ...") would only repeat it
    logging.getLogger("nmt.translator").setLevel(logging.ERROR)
    from nmt.errors import command_errors
    from nmt.memory import tune_for_decoding

    tune_for_decoding()  # this process only decodes (nmt/memory.py)
    with command_errors("nmt-serve"):
        serve(args)


if __name__ == "__main__":
    main()
