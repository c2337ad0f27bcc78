"""Ctrl-C (SIGINT) at N random instants across nmt-train, nmt-evaluate, nmt-translate and nmt-study: no traceback.

    python scripts/sigint_storm.py                         # 100 SIGINTs, 25 per command
    python scripts/sigint_storm.py --count 20 --work /tmp/storm --seed 3

A quick run is trained first (WORK/run, the quick preset shrunk: 300 pairs, 6 steps) and a copy of it kept for the
commands to read. Each round starts one command (in turn: nmt-train resuming a copy of the run for 3 more steps,
nmt-evaluate on its last.pt, nmt-translate reading stdin, nmt-study over the run) and sends it one SIGINT at an
instant drawn uniformly over that command's own uninterrupted wall time (measured once first), so its start, its
imports, Hydra, the data, the decoding and its end are all hit. A round passes when the command printed no
traceback (no "Traceback", no "KeyboardInterrupt") and ended with 130 after one line, or 0 (nmt-train: the trainer
stopped after its step and saved), or 2 (refused), or by the signal without a word (it came before Python itself
had started: no program's handler exists yet). Prints a line per round and a JSON summary; exits 1 if any round
failed, its output kept in WORK/failed-<n>.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
ENV = {"PYTHONUNBUFFERED": "1"} | {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "NMT_DEBUG")}
TINY = [
    "experiment=quick",
    "data.train_size=300",
    "data.valid_size=20",
    "data.test_size=20",
    "trainer.valid_every=3",
    "trainer.heatmaps=1",
    "trainer.threads=1",
    "trainer.progress=false",
]


def commands(work: Path, run: Path, n: int) -> dict[str, tuple[list[str], Path]]:
    """name -> (argv, the copy of the run it works in), for round `n`."""
    copy = work / f"copy{n}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run, copy / "run")
    last = copy / "run" / "checkpoints" / "last.pt"
    data = f"paths.data_dir={work / 'data'}"
    return {
        "nmt-train": ([*TINY, "trainer.max_steps=9", f"hydra.run.dir={copy / 'run'}", data], copy),
        "nmt-evaluate": ([f"checkpoint={last}", f"output={copy / 'eval'}", "heatmaps=1", data], copy),
        "nmt-translate": ([str(last)], copy),
        "nmt-study": ([str(copy), "--beam", "1", "--output", str(copy / "study")], copy),
    }


def run_once(name: str, argv: list[str], cwd: Path, delay: float | None) -> tuple[int, str, float]:
    """(exit status, output, seconds): `name` run with `argv`, SIGINT after `delay` seconds (None: never)."""
    started = time.time()
    proc = subprocess.Popen(
        [str(BIN / name), *argv],
        cwd=cwd,
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if name == "nmt-translate" and delay is None:
        proc.stdin.write("bimi raka\n" * 20)
    if name == "nmt-translate":
        proc.stdin.write("bimi raka\n")
        proc.stdin.flush()
    if delay is not None:
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=600)  # closes stdin: nmt-translate then ends
    return proc.returncode, out, time.time() - started


def verdict(name: str, status: int, out: str) -> str | None:
    """Why round's output fails (None: it passes)."""
    if "Traceback" in out or "KeyboardInterrupt" in out:
        return "a traceback"
    if status == 130:
        return None if out.rstrip().endswith(f"{name}: interrupted") else "exit 130 without the one line"
    if status == -signal.SIGINT:
        return None if not out.strip() else "ended by the signal after printing"
    return None if status in (0, 2) else f"exit status {status}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100, help="how many SIGINTs (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="of the random instants")
    parser.add_argument("--work", type=Path, default=Path("sigint_storm"), help="where the runs go (emptied first)")
    args = parser.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run = work / "run"
    first = [*TINY, "trainer.max_steps=6", f"hydra.run.dir={run}", f"paths.data_dir={work / 'data'}"]
    status, out, _ = run_once("nmt-train", first, work, None)
    if status != 0:
        sys.exit(f"the quick run failed:\n{out[-3000:]}")
    names = ["nmt-train", "nmt-evaluate", "nmt-translate", "nmt-study"]
    durations = {}
    for name in names:  # each command's uninterrupted wall time: the range of its instants
        argv, cwd = commands(work, run, -1)[name]
        status, out, durations[name] = run_once(name, argv, cwd, None)
        if status != 0:
            sys.exit(f"{name} failed uninterrupted:\n{out[-3000:]}")
    rng = random.Random(args.seed)
    counts = {"rounds": 0, "tracebacks": 0, "failed": 0, "exit_130": 0, "exit_0": 0, "exit_2": 0, "by_signal": 0}
    for n in range(args.count):
        name = names[n % len(names)]
        argv, cwd = commands(work, run, n)[name]
        delay = rng.uniform(0, durations[name])
        status, out, _ = run_once(name, argv, cwd, delay)
        why = verdict(name, status, out)
        counts["rounds"] += 1
        key = {130: "exit_130", 0: "exit_0", 2: "exit_2", -signal.SIGINT: "by_signal"}.get(status)
        if key:
            counts[key] += 1
        counts["tracebacks"] += why == "a traceback"
        if why:
            counts["failed"] += 1
            (work / f"failed-{n}.txt").write_text(out)
        print(f"{n:3d} {name:13s} SIGINT at {delay:5.2f} s: exit {status}{'' if why is None else ' FAILED: ' + why}")
        shutil.rmtree(cwd, ignore_errors=True)
    print(json.dumps({**counts, "seconds_uninterrupted": {k: round(v, 1) for k, v in durations.items()}}))
    sys.exit(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
