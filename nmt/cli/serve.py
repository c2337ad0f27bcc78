"""nmt-serve: compare checkpoints in the browser, their translations and attention side by side.

    nmt-serve none/checkpoints/best.pt luong/checkpoints/best.pt          # then open http://127.0.0.1:8000/
    nmt-serve best.pt --port 0                                            # any free port (the URL is printed)
    curl -s localhost:8000/translate -d '{"text": "ein Test .", "beam": 5}'

Loads every checkpoint once, then serves the page and its JSON API (nmt/serve/app.py) with uvicorn on
loopback. Free of Hydra, like nmt-translate; torch is imported only after the arguments are checked and
the port is bound, so `--help` and a port in use are answered at once.
"""

from __future__ import annotations

import argparse
import errno
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
  Errors are {"error": "..."} with status 400 (bad input), 413 (body too large), 503 (busy or too slow).

limits:
  a text over --max-chars characters, or over --max-pieces source pieces, is cut there and the reply
  says so; a request waits at most --timeout seconds. Each checkpoint translates one request at a time
  (its own worker thread); the checkpoints of one request run side by side.

examples:
  nmt-serve outputs/none/checkpoints/best.pt outputs/luong/checkpoints/best.pt
  nmt-serve run/checkpoints/best.pt --port 8080 --threads 2
  nmt-serve run/checkpoints/best.pt --host 0.0.0.0    # reachable from other machines: no authentication!
"""
LOOPBACK = ("127.0.0.1", "localhost", "::1")


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
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        p.error(f"--port {args.port}: use a port from 1 to 65535, or 0 for any free port")
    for name, low in (("threads", 1), ("max_chars", 1), ("max_pieces", 2)):
        value = getattr(args, name)
        if value is not None and value < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}")
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    return args


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (not yet listening); ConfigError with the fix if that is impossible."""
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
    import uvicorn

    from nmt.device import resolve_device
    from nmt.serve.app import create_app
    from nmt.serve.examples import find_examples
    from nmt.serve.models import Limits, load_models, set_threads

    set_threads(args.threads or max(1, (os.cpu_count() or 1) // len(args.checkpoints)))
    device = resolve_device(args.device, "--device ")
    models, first = load_models(args.checkpoints, device, args.amp)
    examples = find_examples(first, args.checkpoints[0])
    for m in models:
        print(f"nmt-serve: {m.path}: {m.label}, {m.settings['parameters']:,} parameters", flush=True)
    limits = Limits(max_chars=args.max_chars, max_pieces=args.max_pieces, timeout=args.timeout)
    loopback = args.host in LOOPBACK
    allowed = [*LOOPBACK, "[::1]"] if loopback else None
    app = create_app(models, examples, limits, allowed_hosts=allowed)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=5,
        limit_concurrency=64,
        timeout_graceful_shutdown=5,
    )
    sock.listen(128)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if not loopback:
        print(
            f"nmt-serve: warning: listening on {args.host}: anyone who can reach this machine can use the "
            "server (there is no authentication)",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"nmt-serve: serving {len(models)} checkpoint{'s' if len(models) > 1 else ''} on http://{shown}:{port}/ "
        f"(ready in {time.perf_counter() - started:.1f} s; Ctrl-C stops)",
        flush=True,
    )
    uvicorn.Server(config).run(sockets=[sock])


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
