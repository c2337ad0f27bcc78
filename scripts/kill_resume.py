"""Kill -9 a quick training run at N random instants and check that nothing is lost.

    python scripts/kill_resume.py                            # 200 kills (about 45 minutes on 2 busy cores)
    python scripts/kill_resume.py --kills 20 --work /tmp/kills
    python scripts/kill_resume.py --kills 20 -- trainer.max_steps=100   # more overrides for both runs

A reference run trains uninterrupted in WORK/reference. Then the same run is started in WORK/killed and killed with
SIGKILL at an instant drawn uniformly over the reference's wall time (so the start, the steps, validations, the
checkpoint writes and the end are all hit), again and again; each start resumes where the last checkpoint left off
(trainer.resume=auto). After every kill:
  - every checkpoint in checkpoints/ loads, its digest verified (nmt.checkpoint.load_checkpoint);
  - metrics.json, where there is one, is whole and names the best step best.pt holds;
  - best.pt holds the best step last.pt records, or, where a kill fell between the two writes, last.pt records a
    best at its own step: the next start repairs best.pt from it (its output says so; counted).
When a start finishes the run (it ended before its kill), the run is compared with the reference: last.pt's
weights and optimizer state and best.pt's weights bitwise equal, metrics.json's best the same, no temporary file
left; then the run directory is emptied and the next start begins afresh. After N kills the last run is let finish
and compared. Each start's output is kept in WORK/logs/. Prints a line per kill and a JSON summary at the end;
exits 1 at the first violation, naming it.
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

import torch

from nmt.checkpoint import load_checkpoint

QUICK = [
    "experiment=quick",
    "data.train_size=2000",
    "trainer.max_steps=60",
    "trainer.valid_every=10",  # a checkpoint write (and, best by loss, a best.pt copy) every 10 steps
    "trainer.log_every=10",
    "trainer.best_metric=loss",
    "trainer.threads=1",  # the same arithmetic in every start: bitwise comparisons
    "trainer.progress=false",
]


def start(run_dir: Path, data_dir: Path, overrides: list[str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "nmt.cli.train", *QUICK, *overrides]
    cmd += [f"hydra.run.dir={run_dir}", f"paths.data_dir={data_dir}"]
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "NMT_DEBUG")}
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


class Violation(Exception):
    """What a kill left that it must not have."""


def check_after_kill(run_dir: Path) -> str:
    """The run directory a kill left: "empty", "consistent" or "repairable" (best.pt one improvement behind last.pt,
    to be repaired by the next start); a Violation otherwise."""
    ckpts = sorted((run_dir / "checkpoints").glob("*.pt"))
    loaded = {}
    for path in ckpts:
        try:
            loaded[path.name] = load_checkpoint(path)
        except Exception as e:  # a CheckpointError: cut off, or not matching its digest
            raise Violation(f"{path} does not load: {e}") from None
    best = loaded.get("best.pt")
    summary = run_dir / "metrics.json"
    if summary.exists():
        try:
            named = json.loads(summary.read_text())["best"]["step"]
        except (ValueError, KeyError) as e:
            raise Violation(f"{summary} is not whole: {e}") from None
        if best is None or best["step"] != named:
            raise Violation(f"metrics.json names step {named} as best, best.pt holds {best and best['step']}")
    last = loaded.get("last.pt")
    if last is None or not last["best"]:
        return "empty" if not loaded else "consistent"
    want = last["best"]["step"]
    if best is not None and best["step"] == want:
        return "consistent"
    if last["step"] == want:
        return "repairable"
    raise Violation(f"last.pt records the best at step {want}, best.pt holds {best and best['step']}")


def compare(run_dir: Path, reference: Path) -> None:
    """The finished run against the uninterrupted one: bitwise, and metrics.json's best; no temporary file left."""
    for name in ("last.pt", "best.pt"):
        ours, theirs = (load_checkpoint(d / "checkpoints" / name) for d in (run_dir, reference))
        for key in theirs["model"]:
            if not torch.equal(ours["model"][key], theirs["model"][key]):
                raise Violation(f"{name}: {key} differs from the uninterrupted run's")
        if name == "last.pt" and not same(ours["optimizer"], theirs["optimizer"]):
            raise Violation("last.pt: the optimizer state differs from the uninterrupted run's")
    ours, theirs = (json.loads((d / "metrics.json").read_text())["best"] for d in (run_dir, reference))
    if ours != theirs:
        raise Violation(f"metrics.json's best {ours} differs from the uninterrupted run's {theirs}")
    left = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name not in ("last.pt", "best.pt")]
    if left:
        raise Violation(f"files left in checkpoints/: {left}")


def same(a: object, b: object) -> bool:
    """Bitwise equality of nested dicts and lists of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200, help="how many kill -9 (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="of the random instants")
    parser.add_argument("--work", type=Path, default=Path("kill_resume"), help="where the runs go (emptied first)")
    parser.add_argument("overrides", nargs="*", help="more nmt-train overrides, after --")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    shutil.rmtree(args.work, ignore_errors=True)
    logs, data_dir = args.work / "logs", args.work / "data"
    logs.mkdir(parents=True)
    reference, run_dir = args.work / "reference", args.work / "killed"

    began = time.monotonic()
    if start(reference, data_dir, args.overrides, logs / "reference.txt").wait() != 0:
        sys.exit(f"the reference run failed: see {logs / 'reference.txt'}")
    duration = time.monotonic() - began
    print(f"reference run: {duration:.1f} s; kills drawn uniformly over that", flush=True)

    names = ("kills", "instants_after_the_end", "finished_runs", "repairable", "repaired", "took_over")
    counts = dict.fromkeys(names, 0)
    attempt, pending_repair = 0, False
    try:
        while True:
            attempt += 1
            log = logs / f"{attempt:04d}.txt"
            proc = start(run_dir, data_dir, args.overrides, log)
            killing = counts["kills"] < args.kills
            if killing:
                delay = rng.uniform(0, duration)
                try:
                    proc.wait(timeout=delay)
                    counts["instants_after_the_end"] += 1  # the start ended first: no kill
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    counts["kills"] += 1
            code = proc.wait()
            output = log.read_text(errors="replace")
            counts["repaired"] += output.count("repaired from last.pt")
            counts["took_over"] += output.count("took over the lock")
            if pending_repair and "resumed from" in output and "repaired from last.pt" not in output:
                raise Violation(f"start {attempt} resumed without repairing best.pt (see {log})")
            if code == 0:
                compare(run_dir, reference)
                counts["finished_runs"] += 1
                print(f"start {attempt}: finished, equal to the uninterrupted run", flush=True)
                if not killing:
                    break
                shutil.rmtree(run_dir)
                pending_repair = False
                continue
            if code != -signal.SIGKILL:
                raise Violation(f"start {attempt} failed with status {code} (see {log})")
            state = check_after_kill(run_dir)
            pending_repair = state == "repairable"
            counts["repairable"] += state == "repairable"
            print(f"start {attempt}: killed after {delay:.2f} s: {state}", flush=True)
    except Violation as e:
        print(f"VIOLATION: {e}", flush=True)
        print(json.dumps(counts))
        sys.exit(1)
    print(json.dumps({**counts, "reference_seconds": round(duration, 1), "starts": attempt}))


if __name__ == "__main__":
    main()
