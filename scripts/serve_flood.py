"""python scripts/serve_flood.py CKPT [CKPT ...] [--idle 1000] [--half 200] [--slow 100] [--requests 20]
       [--slow-readers 66] [--never-read 66] [--attack-seconds 30] [--burst 300] [--out FILE]

Whether idle, slow and greedy clients starve nmt-serve, measured from outside as an attacker and a user see it:

    python scripts/serve_flood.py none/checkpoints/best.pt luong/checkpoints/best.pt --out docs/serve_flood.json

1. starts `nmt-serve CKPT ... --port 0` (extra arguments after `--` go to it, e.g. -- --max-connections 64);
2. baseline: --requests POST /translate of the first example sentence, greedy, one after another;
3. opens --idle connections that send nothing, --half that send half a request's headers and --slow that send
   whole headers and one byte of a 100-byte body, all at once and all held open;
4. meanwhile the same --requests requests again, each on a new connection: their status and wall time;
5. waits until the server has closed every held connection: when (seconds after it opened) and what it said;
6. slow readers (scripts/serve_attacks.py): --slow-readers connections that pipeline --pipeline GET
   /static/serve.js and read --read-rate bytes a second each, and --never-read that pipeline the same and never
   read; meanwhile, for --attack-seconds, a normal client sends POST /translate one after another: how many
   were answered 200 within 1 s (issue 51's floor: 99%), and which attackers the server cut, when;
7. a burst: --burst clients at once (past nmt-serve's --max-connections, 256 by default), each sending
   --burst-requests POST /translate one after another on new connections: what came back (200, 503 in JSON,
   or a reset); then 3 more requests, to see the server still answers.
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
from serve_attacks import burst, slow_readers  # noqa: E402  (sibling scripts)
from serve_latency import call, cpu_name, start  # noqa: E402

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


def requests(url: str, text: str, n: int, seconds: float | None = None) -> dict:
    """`n` POST /translate one after another (or as many as fit in `seconds`), each on a new connection: their
    statuses, wall times, and how many were answered 200 within 1 s."""
    statuses, walls, fast, until = Counter(), [], 0, time.monotonic() + (seconds or 0)
    while (time.monotonic() < until) if seconds else (len(walls) < n):
        began = time.perf_counter()
        try:
            status, _ = call(url + "translate", "POST", {"text": text, "beam": 1}, timeout=30)
        except OSError as e:
            status = type(e).__name__
        walls.append(time.perf_counter() - began)
        statuses[str(status)] += 1
        fast += status == 200 and walls[-1] <= 1
    return {
        "requests": len(walls),
        "statuses": dict(statuses),
        "answered_200_within_1s": fast,
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[3], epilog="see the module docstring")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--half", type=int, default=200)
    p.add_argument("--slow", type=int, default=100)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the server to close them all")
    p.add_argument("--slow-readers", type=int, default=66)
    p.add_argument("--never-read", type=int, default=66)
    p.add_argument("--pipeline", type=int, default=3000, help="requests each slow reader sends at once")
    p.add_argument("--read-rate", type=float, default=15000, help="bytes a second each slow reader reads")
    p.add_argument("--attack-seconds", type=float, default=30.0, help="how long the normal client asks meanwhile")
    p.add_argument("--burst", type=int, default=300, help="clients at once")
    p.add_argument("--burst-requests", type=int, default=3, help="requests each, one after another")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(args.idle + args.half + args.slow, args.slow_readers + args.never_read, args.burst) + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    load = round(os.getloadavg()[0], 2)
    proc, url, _ = start(args.checkpoints, extra)
    port = urlsplit(url).port
    try:
        text = json.loads(call(url + "api/models")[1])["examples"]["sentences"][0]
        requests(url, text, 3)  # warm-up
        baseline = requests(url, text, args.requests)
        rss = {"before": rss_mib(proc.pid)}

        def during(when: str, seconds: float | None = None) -> dict:
            measured = requests(url, text, args.requests, seconds)
            rss[when] = rss_mib(proc.pid)
            return measured

        counts = {"idle": args.idle, "half": args.half, "slow": args.slow}
        held, attacked = hold(port, counts, args.wait, lambda: during("held connections"))
        after = requests(url, text, args.requests)
        readers, read_attack = slow_readers(
            port,
            args.slow_readers,
            args.never_read,
            args.pipeline,
            args.read_rate,
            lambda: during("slow readers", args.attack_seconds),
        )
        body = json.dumps({"text": text, "beam": 1}).encode()
        request = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        request += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        bursted = burst(port, args.burst, args.burst_requests, request)
        alive = requests(url, text, 3)
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
        "slow_reader_attack": {
            "pipeline": args.pipeline,
            "read_rate_bytes_per_s": args.read_rate,
            "attackers": readers,
            "requests_during": read_attack,
        },
        "burst": bursted,
        "requests_after_the_burst": alive,
        "server_rss_mib": rss,
    }
    print(f"CPU: {report['cpu']}; load average {load} before the run; nmt-serve {' '.join(extra) or '(defaults)'}")
    for when, r in (("before", baseline), ("during", attacked), ("after", after), ("slow readers", read_attack)):
        print(
            f"POST /translate {when:12}: {r['statuses']}, {r['answered_200_within_1s']} of {r['requests']} "
            f"answered 200 within 1 s, median {r['median_ms']} ms, max {r['max_ms']} ms"
        )
    for kind, h in held.items():
        print(
            f"{h['connections']:5} {kind:4} connections: {h['closed']} closed by the server, after (s) "
            f"{h['closed_after_s']}; {h['replies']}"
        )
    for kind, a in readers.items():
        cut = a["cut_by_the_server"]
        print(f"{a['connections']:5} {kind} readers: {cut} cut by the server, after (s) {a['cut_after_s']}")
    print(f"burst of {args.burst} clients x {args.burst_requests} requests: {bursted['outcomes']}")
    print(f"after the burst: {alive['statuses']}")
    print(f"server memory (RSS, MiB): {rss}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
