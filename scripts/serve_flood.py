"""python scripts/serve_flood.py CKPT [CKPT ...] [--idle 1000] [--half 200] [--slow 100] [--requests 20]
       [--slow-readers 66] [--never-read 66] [--attack-seconds 30] [--burst 300] [--page-readers 6]
       [--chunkers 4] [--reconnecting 300] [--phases held,readers,burst,pages,reconnect] [--out FILE]

Whether idle, slow and greedy clients starve nmt-serve, measured from outside as an attacker and a user see it:

    python scripts/serve_flood.py luong/checkpoints/best.pt selfattn/checkpoints/best.pt --out docs/serve_flood.json

1. starts `nmt-serve CKPT ... --port 0` (extra arguments after `--` go to it, e.g. -- --max-connections 64);
2. baseline: --requests POST /translate of the first example sentence, greedy, one after another;
3. (held) opens --idle connections that send nothing, --half that send half a request's headers and --slow that
   send whole headers and one byte of a 100-byte body, all at once and all held open; meanwhile the same
   --requests requests again, each on a new connection: their status and wall time; then waits until the server
   has closed every held connection: when (seconds after it opened) and what it said;
4. (readers) slow readers (scripts/serve_attacks.py): --slow-readers connections that pipeline --pipeline GET
   /static/serve.js and read --read-rate bytes a second each, and --never-read that pipeline the same and never
   read; meanwhile, for --attack-seconds, a normal client sends POST /translate one after another: how many
   were answered 200 within 1 s (the target: 99%), and which attackers the server cut, when;
5. (burst) --burst clients at once (past nmt-serve's --max-connections, 256 by default), each sending
   --burst-requests POST /translate one after another on new connections: what came back (200, 503 in JSON,
   or a reset); then 3 more requests, to see the server still answers;
6. (pages) --page-readers clients that POST the page's form with --page-words words (the example sentences
   repeated; cut to the server's --max-pieces) and never read the page, asking again once it has begun, and
   --chunkers that send a 65,021-byte body in 1-byte chunks again and again; meanwhile the normal client for
   --attack-seconds (the target: 99% answered 200 within 1 s; the pages are large with a checkpoint that has
   self-attention in its encoder; one such page is first asked for alone and read whole: its size and time);
7. (reconnect) --reconnecting connections that pipeline --pipeline GET /static/serve.js and never read, each
   replaced at once when the server closes it; meanwhile the normal client for --attack-seconds (the target:
   95% answered 200 within 1 s).
The normal client runs in a process of its own while attackers run (their threads share this one's lock).
--phases picks which of 3-7 run (all by default). It prints a table and writes JSON with --out (this command
included; scripts/serve_tables.py writes docs/serving.md's tables from it); the server's resident memory is read
from /proc (Linux).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
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
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).parent))
from serve_attacks import burst, page_once, pages_and_chunks, reconnecting, slow_readers  # noqa: E402  (siblings)
from serve_latency import call, command_line, cpu_name, start  # noqa: E402

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


def requests_apart(url: str, text: str, n: int, seconds: float | None = None) -> dict:
    """requests() in a process of its own: the attackers' threads here would otherwise slow the normal client."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(requests, url, text, n, seconds).result()


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


PHASES = ("held", "readers", "burst", "pages", "reconnect")
FLOORS = {"slow_reader_attack": 0.99, "page_and_chunk_attack": 0.99, "reconnecting_never_readers": 0.95}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[4], epilog="see the module docstring")
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
    p.add_argument("--page-readers", type=int, default=6, help="clients asking for pages they never read")
    p.add_argument("--page-words", type=int, default=150, help="words of their text")
    p.add_argument("--chunkers", type=int, default=4, help="clients sending bodies in 1-byte chunks")
    p.add_argument("--reconnecting", type=int, default=300, help="never-reading pipeliners, replaced when closed")
    p.add_argument("--phases", default=",".join(PHASES), help=f"which to run, of {','.join(PHASES)}")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    args.phases = args.phases.split(",")
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        p.error(f"--phases: unknown {', '.join(sorted(unknown))}; pick from {','.join(PHASES)}")
    return args


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(args.idle + args.half + args.slow, args.slow_readers + args.never_read, args.burst)
    want = max(want, args.reconnecting * 2, args.page_readers * 100) + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    load = round(os.getloadavg()[0], 2)
    proc, url, _ = start(args.checkpoints, extra)
    port = urlsplit(url).port
    report: dict = {
        "command": command_line(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_1min_before": load,
        "cpu": cpu_name(),
        "checkpoints": args.checkpoints,
        "server_args": extra,
    }
    try:
        info = json.loads(call(url + "api/models")[1])
        report["self_attention"] = [m["label"] for m in info["models"] if m["has_self_attention"]]
        text = report["text"] = info["examples"]["sentences"][0]
        requests(url, text, 3)  # warm-up
        report["requests_before"] = requests(url, text, args.requests)
        rss = report["server_rss_mib"] = {"before": rss_mib(proc.pid)}

        def during(when: str, seconds: float | None = None) -> dict:
            measured = requests_apart(url, text, args.requests, seconds)
            rss[when] = rss_mib(proc.pid)
            return measured

        if "held" in args.phases:
            counts = {"idle": args.idle, "half": args.half, "slow": args.slow}
            report["held_connections"], report["requests_during"] = hold(
                port, counts, args.wait, lambda: during("held connections")
            )
            report["requests_after"] = requests(url, text, args.requests)
        if "readers" in args.phases:
            readers, read_attack = slow_readers(
                port,
                args.slow_readers,
                args.never_read,
                args.pipeline,
                args.read_rate,
                lambda: during("slow readers", args.attack_seconds),
            )
            report["slow_reader_attack"] = {
                "pipeline": args.pipeline,
                "read_rate_bytes_per_s": args.read_rate,
                "attackers": readers,
                "requests_during": read_attack,
            }
        if "burst" in args.phases:
            body = json.dumps({"text": text, "beam": 1}).encode()
            request = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            request += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            report["burst"] = burst(port, args.burst, args.burst_requests, request)
            report["requests_after_the_burst"] = requests(url, text, 3)
        if "pages" in args.phases:
            words = " ".join(info["examples"]["sentences"]).split()
            page_text = " ".join((words * (args.page_words // max(1, len(words)) + 1))[: args.page_words])
            alone = page_once(port, page_text)
            attackers, measured = pages_and_chunks(
                port, args.page_readers, args.chunkers, page_text, lambda: during("pages", args.attack_seconds)
            )
            report["page_and_chunk_attack"] = {"page": alone, "attackers": attackers, "requests_during": measured}
            report["requests_after_pages"] = requests(url, text, 3)
        if "reconnect" in args.phases:
            attackers, measured = reconnecting(
                port, args.reconnecting, args.pipeline, lambda: during("reconnecting", args.attack_seconds)
            )
            report["reconnecting_never_readers"] = {"attackers": attackers, "requests_during": measured}
            report["requests_after_reconnecting"] = requests(url, text, 3)
    finally:
        proc.terminate()
        proc.wait()
    for key, floor in FLOORS.items():
        if key in report:
            r = report[key]["requests_during"]
            r["floor"] = f"{floor:.0%} answered 200 within 1 s"
            r["floor_met"] = r["answered_200_within_1s"] >= floor * r["requests"]
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print_report(report, extra)


def print_report(report: dict, extra: list[str]) -> None:
    print(
        f"CPU: {report['cpu']}; load average {report['load_average_1min_before']} before the run; "
        f"nmt-serve {' '.join(extra) or '(defaults)'}"
    )
    measured = [("before", report["requests_before"])]
    measured += [(when, report.get(key)) for when, key in (("during", "requests_during"), ("after", "requests_after"))]
    for when, key in (("slow readers", "slow_reader_attack"), ("pages", "page_and_chunk_attack")):
        measured.append((when, report.get(key, {}).get("requests_during")))
    measured.append(("reconnecting", report.get("reconnecting_never_readers", {}).get("requests_during")))
    for when, r in measured:
        if r:
            print(
                f"POST /translate {when:12}: {r['statuses']}, {r['answered_200_within_1s']} of {r['requests']} "
                f"answered 200 within 1 s, median {r['median_ms']} ms, max {r['max_ms']} ms"
                + (f" (floor {r['floor']}: {'met' if r['floor_met'] else 'NOT met'})" if "floor" in r else "")
            )
    for kind, h in report.get("held_connections", {}).items():
        print(
            f"{h['connections']:5} {kind:4} connections: {h['closed']} closed by the server, after (s) "
            f"{h['closed_after_s']}; {h['replies']}"
        )
    for kind, a in report.get("slow_reader_attack", {}).get("attackers", {}).items():
        cut = a["cut_by_the_server"]
        print(f"{a['connections']:5} {kind} readers: {cut} cut by the server, after (s) {a['cut_after_s']}")
    if "burst" in report:
        b = report["burst"]
        print(f"burst of {b['clients']} clients x {b['requests_each']} requests: {b['outcomes']}")
        print(f"after the burst: {report['requests_after_the_burst']['statuses']}")
    if "page_and_chunk_attack" in report:
        print(f"page readers and chunkers: {report['page_and_chunk_attack']['attackers']}")
    if "reconnecting_never_readers" in report:
        print(f"reconnecting never-readers: {report['reconnecting_never_readers']['attackers']}")
    print(f"server memory (RSS, MiB): {report['server_rss_mib']}")


if __name__ == "__main__":
    main()
