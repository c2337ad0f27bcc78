"""python scripts/serve_latency.py CKPT [CKPT ...] [--words 20] [--requests 10] [--starts 3] [--out FILE]

How long nmt-serve takes to answer, measured from outside as a user sees it:

    python scripts/serve_latency.py none/checkpoints/best.pt bahdanau/checkpoints/best.pt luong/checkpoints/best.pt

1. start-up: `nmt-serve CKPT ... --port 0` is started --starts times; each time, the seconds from starting the
   process to the first page (GET / answered 200), polled every 10 ms.
2. latency: on the last server, one warm-up request, then --requests POST /translate of one sentence, one
   after another, greedy and then beam 5; the median and range of the wall time of a request (client side)
   and the median of each checkpoint's own model time from the replies (the checkpoints of a request run side
   by side, so a request takes about as long as its slowest checkpoint).
The sentence (--text, or the first test sentence of exactly --words words of the first checkpoint's corpus)
is the same for every request. It prints a table and the CPU; --out writes JSON. Extra arguments after `--`
go to nmt-serve (e.g. -- --threads 2).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

BIN = Path(sys.executable).parent


def call(url: str, method: str = "GET", body: dict | None = None, timeout: float = 120) -> tuple[int, bytes]:
    """One request on a fresh connection, as curl makes it (http.client sends a small body with the headers:
    no Nagle/delayed-ACK pause, which costs some clients 40 ms a request on loopback)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, parts.path or "/", body=data, headers={"Content-Type": "application/json"} if data else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def cpu_name() -> str:
    """The CPU model and whether it has AVX2 / AVX-512, from /proc/cpuinfo (Linux), else platform's name."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags_line = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    isa = "AVX-512" if "avx512f" in flags else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2"
    cores = info.count("processor\t:")
    return f"{model.group(1).strip() if model else platform.machine()} ({isa}), {cores} logical CPUs"


def start(checkpoints: list[str], extra: list[str]) -> tuple[subprocess.Popen, str, float]:
    """Start nmt-serve; (process, base URL, seconds from start to the first page served)."""
    began = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "nmt-serve"), *checkpoints, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = None
    for line in proc.stdout:
        found = re.search(r"on (http://\S+/)", line)
        if found:
            url = found.group(1)
            break
    if url is None:
        raise SystemExit(f"nmt-serve did not start (exit {proc.wait()})")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    while True:
        try:
            if call(url, timeout=5)[0] == 200:
                return proc, url, time.perf_counter() - began
        except OSError:  # not listening yet
            pass
        time.sleep(0.01)


def pick_sentence(checkpoint: str, words: int) -> str:
    import torch

    from nmt.serve.examples import corpus_test_sources

    found = corpus_test_sources(torch.load(checkpoint, weights_only=True), checkpoint)
    sentences = [s for s in (found[0] if found else []) if len(s.split()) == words]
    if not sentences:
        raise SystemExit(f"no test sentence of {words} words found for {checkpoint}; give one with --text")
    return sentences[0]


def latency(url: str, text: str, beam: int, n: int) -> dict:
    call(url + "translate", "POST", {"text": text, "beam": beam})  # warm-up
    walls, models = [], []
    for _ in range(n):
        began = time.perf_counter()
        status, raw = call(url + "translate", "POST", {"text": text, "beam": beam})
        walls.append(time.perf_counter() - began)
        if status != 200:
            raise SystemExit(f"POST /translate answered {status}: {raw[:300]!r}")
        reply = json.loads(raw)
        models.append([r["time"] for r in reply["results"]])
    labels = [r["label"] for r in reply["results"]]
    return {
        "beam": beam,
        "requests": n,
        "median_s": statistics.median(walls),
        "min_s": min(walls),
        "max_s": max(walls),
        "model_median_s": {label: statistics.median(m[i] for m in models) for i, label in enumerate(labels)},
    }


def command_line() -> str:
    """This script's command as a reader would type it again (recorded in the JSON; docs/serving.md shows it)."""
    return shlex.join(["python", f"scripts/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[2], epilog="see the module docstring")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--text", help="the sentence to translate (default: a test sentence of --words words)")
    p.add_argument("--words", type=int, default=20)
    p.add_argument("--requests", type=int, default=10)
    p.add_argument("--starts", type=int, default=3)
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    if shutil.which("nmt-serve", path=str(BIN)) is None:
        raise SystemExit("nmt-serve is not installed in this environment: pip install -e .")
    text = args.text or pick_sentence(args.checkpoints[0], args.words)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None  # other work on the machine
    startups = []
    for k in range(args.starts):
        proc, url, seconds = start(args.checkpoints, extra)
        startups.append(seconds)
        if k < args.starts - 1:
            proc.terminate()
            proc.wait()
    try:
        runs = [latency(url, text, beam, args.requests) for beam in (1, 5)]
    finally:
        proc.terminate()
        proc.wait()
    report = {
        "command": command_line(),
        "measured": when,
        "load_average_1min_before": load,
        "cpu": cpu_name(),
        "checkpoints": args.checkpoints,
        "server_args": extra,
        "text": text,
        "words": len(text.split()),
        "startup_s": startups,
        "startup_median_s": statistics.median(startups),
        "latency": runs,
    }
    print(f"CPU: {report['cpu']}; {when}, load average {load} before the run")
    print(f"{len(args.checkpoints)} checkpoints; sentence of {report['words']} words: {text}")
    print(
        f"start to first page: median {report['startup_median_s']:.2f} s over {args.starts} starts "
        f"({', '.join(f'{s:.2f}' for s in startups)})"
    )
    for r in runs:
        models = ", ".join(f"{label.split(' ')[0]} {s * 1000:.0f}" for label, s in r["model_median_s"].items())
        print(
            f"beam {r['beam']}: request median {r['median_s'] * 1000:.0f} ms (min {r['min_s'] * 1000:.0f}, max "
            f"{r['max_s'] * 1000:.0f}) over {r['requests']}; model time medians (ms): {models}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
