"""python scripts/serve_flood.py CKPT [CKPT ...] [--idle 1000] [--half 200] [--slow 100] [--requests 20] [--out FILE]

Whether idle and slow clients starve nmt-serve, measured from outside as an attacker and a user see it:

    python scripts/serve_flood.py none/checkpoints/best.pt luong/checkpoints/best.pt --out docs/serve_flood.json

1. starts `nmt-serve CKPT ... --port 0` (extra arguments after `--` go to it, e.g. -- --max-connections 64);
2. baseline: --requests POST /translate of the first example sentence, greedy, one after another;
3. opens --idle connections that send nothing, --half that send half a request's headers and --slow that send
   whole headers and one byte of a 100-byte body, all at once and all held open;
4. meanwhile the same --requests requests again, each on a new connection: their status and wall time;
5. waits until the server has closed every held connection: when (seconds after it opened) and what it said.
It prints a table and writes JSON with --out; the server's resident memory is read from /proc (Linux).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import selectors
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).parent))
from serve_latency import call, cpu_name, start  # noqa: E402  (a sibling script)

KINDS = {
    "idle": b"",
    "half": b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-",
    "slow": b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{",
}


def rss_mib(pid: int) -> float | None:
    try:
        found = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return None
    return round(int(found.group(1)) / 1024, 1) if found else None


def requests(url: str, text: str, n: int) -> dict:
    statuses, walls = Counter(), []
    for _ in range(n):
        began = time.perf_counter()
        try:
            status, _ = call(url + "translate", "POST", {"text": text, "beam": 1}, timeout=30)
        except OSError as e:
            status = type(e).__name__
        walls.append(time.perf_counter() - began)
        statuses[str(status)] += 1
    return {
        "statuses": dict(statuses),
        "median_ms": round(statistics.median(walls) * 1000, 1),
        "max_ms": round(max(walls) * 1000, 1),
    }


def hold(port: int, counts: dict[str, int], limit: float, during) -> tuple[dict, object]:
    """Open the connections, run `during()` meanwhile, and watch them until the server closes every one."""
    opened, kind_of, said = {}, {}, {}
    for kind, n in counts.items():
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port))
            if KINDS[kind]:
                sock.sendall(KINDS[kind])
            sock.setblocking(False)
            opened[sock], kind_of[sock], said[sock] = time.monotonic(), kind, b""
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("during", during()))
    worker.start()
    closed = {}
    with selectors.DefaultSelector() as sel:
        for sock in opened:
            sel.register(sock, selectors.EVENT_READ)
        began = time.monotonic()
        while len(closed) < len(opened) and time.monotonic() - began < limit:
            for key, _ in sel.select(timeout=0.05):
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                said[sock] += data
                if not data:
                    closed[sock] = time.monotonic() - opened[sock]
                    sel.unregister(sock)
    worker.join()
    summary = {}
    for kind, n in counts.items():
        socks = [s for s in opened if kind_of[s] == kind]
        times = sorted(closed[s] for s in socks if s in closed)
        replies = Counter((said[s].split(b"\r\n", 1)[0].decode("latin-1") or "(closed in silence)") for s in socks)
        summary[kind] = {
            "connections": n,
            "closed": len(times),
            "closed_after_s": {
                "min": round(times[0], 2),
                "median": round(statistics.median(times), 2),
                "max": round(times[-1], 2),
            }
            if times
            else None,
            "replies": dict(replies),
        }
    for sock in opened:
        sock.close()
    return summary, result.get("during")


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[2], epilog="see the module docstring")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--half", type=int, default=200)
    p.add_argument("--slow", type=int, default=100)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the server to close them all")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.idle + args.half + args.slow + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    load = round(os.getloadavg()[0], 2)
    proc, url, _ = start(args.checkpoints, extra)
    try:
        text = json.loads(call(url + "api/models")[1])["examples"]["sentences"][0]
        requests(url, text, 3)  # warm-up
        baseline = requests(url, text, args.requests)
        rss_before = rss_mib(proc.pid)
        peak = {}

        def during() -> dict:
            measured = requests(url, text, args.requests)
            peak["rss"] = rss_mib(proc.pid)
            return measured

        counts = {"idle": args.idle, "half": args.half, "slow": args.slow}
        held, attacked = hold(urlsplit(url).port, counts, args.wait, during)
        after = requests(url, text, args.requests)
    finally:
        proc.terminate()
        proc.wait()
    report = {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_1min_before": load,
        "cpu": cpu_name(),
        "checkpoints": args.checkpoints,
        "server_args": extra,
        "text": text,
        "requests_before": baseline,
        "requests_during": attacked,
        "requests_after": after,
        "held_connections": held,
        "server_rss_mib": {"before": rss_before, "during": peak.get("rss")},
    }
    print(f"CPU: {report['cpu']}; load average {load} before the run; nmt-serve {' '.join(extra) or '(defaults)'}")
    for when in ("before", "during", "after"):
        r = report[f"requests_{when}"]
        print(f"POST /translate {when:6}: {r['statuses']}, median {r['median_ms']} ms, max {r['max_ms']} ms")
    for kind, h in held.items():
        print(
            f"{h['connections']:5} {kind:4} connections: {h['closed']} closed by the server, after (s) "
            f"{h['closed_after_s']}; {h['replies']}"
        )
    print(f"server memory (RSS, MiB): {report['server_rss_mib']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
