"""python scripts/busy_machine.py [--steps 200] [--repeats 3] [--threads auto,1,2] [--out busy.json]

How training's speed survives a busy machine: the quick preset (`nmt-train experiment=quick`) for
--steps steps, on a quiet machine and with one busy process beside it (a Python loop that keeps one core busy),
at each trainer.threads of --threads. Run it on a machine that is otherwise quiet: it says so when it is not.

    python scripts/busy_machine.py                              # the full measurement: ~12 min on 2 cores
    python scripts/busy_machine.py --steps 20 --repeats 1       # a quick check that it works
    python scripts/busy_machine.py --threads auto,1,2,null      # null: torch's own count, as before auto

Every run is a fresh `nmt-train` process on the corpus prepared once beforehand; the (load, threads) pairs take
turns, repeat after repeat, so a drift in the machine spreads over all of them. Each run's time is its training
seconds up to the final validation (metrics.json's last validation `elapsed`: the steps alone) and its whole
process, start to exit; the thread count auto chose and why come from metrics.json. The median of each pair is
compared with the project's targets:

    busy:  auto <= 1.5 x threads=1 under the same load
    quiet: auto within 5% of threads=2 (torch's count on 2 cores: the default before auto)

Before each quiet run the load of other processes is measured for a second (nmt.threads.LoadMeter) and recorded;
a quiet run beside more than a quarter of a core of other work is flagged. --out writes every run and the
summary as JSON, with the machine (nmt.provenance.describe_machine) and this command.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from nmt.provenance import describe_machine
from nmt.threads import LoadMeter

BIN = Path(sys.executable).parent
BUSY = [sys.executable, "-c", "while True: pass"]
FLOORS = {"busy": ("auto", "1", 1.5), "quiet": ("auto", "2", 1.05)}  # load: (threads, against, at most x)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="training steps a run (default 200)")
    p.add_argument("--repeats", type=int, default=3, help="runs of every (load, threads) pair (default 3)")
    p.add_argument("--threads", default="auto,1,2", help="trainer.threads values, comma-separated (default auto,1,2)")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--out", type=Path, default=None, help="write the runs and the summary as JSON")
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        p.error("--steps and --repeats must be at least 1")
    return args


def quiet_load(seconds: float = 1.0) -> float:
    """Cores' worth of time other processes ran over `seconds` (this process sleeps meanwhile)."""
    meter = LoadMeter()
    time.sleep(seconds)
    load = meter.read()
    return -1.0 if load is None else round(load.others, 2)


def train(work: Path, name: str, steps: int, threads: str) -> dict:
    """One nmt-train run of the quick preset; its times and the thread count it used."""
    run_dir = work / "runs" / name
    cmd = [
        str(BIN / "nmt-train"),
        "experiment=quick",
        f"trainer.max_steps={steps}",
        f"trainer.valid_every={steps}",
        f"trainer.threads={threads}",
        "trainer.progress=false",
        f"paths.data_dir={work / 'data'}",
        f"hydra.run.dir={run_dir}",
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"busy_machine: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {
        "train_s": metrics["final"]["elapsed"],
        "process_s": round(wall, 2),
        "threads_used": metrics["threads"]["count"],
        "why": metrics["threads"]["why"],
        "step": metrics["step"],
    }


def summarize(runs: list[dict]) -> dict:
    """Median training seconds of each (load, threads) pair, and the floors' ratios where both sides ran; the
    quiet floor is not judged (met: null) where a quiet run had other work beside it."""
    medians: dict[str, dict[str, float]] = {}
    for run in runs:
        medians.setdefault(run["load"], {}).setdefault(run["threads"], [])
        medians[run["load"]][run["threads"]].append(run["train_s"])
    medians = {load: {t: statistics.median(v) for t, v in by.items()} for load, by in medians.items()}
    floors = {}
    for load, (ours, theirs, limit) in FLOORS.items():
        by = medians.get(load, {})
        if ours in by and theirs in by and by[theirs] > 0:
            ratio = by[ours] / by[theirs]
            judged = load != "quiet" or not any("note" in r for r in runs if r["load"] == "quiet")
            floors[f"{load}: {ours} / {theirs}"] = {
                "ratio": round(ratio, 3),
                "at_most": limit,
                "met": ratio <= limit if judged else None,  # None: the machine was not quiet
            }
    return {"median_train_s": medians, "floors": floors}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="busy_machine_"))
    work.mkdir(parents=True, exist_ok=True)
    prepare = [str(BIN / "nmt-prepare"), "experiment=quick", f"paths.data_dir={work / 'data'}"]
    subprocess.run(prepare, check=True, capture_output=True, cwd=work)
    threads = args.threads.split(",")
    runs = []
    for repeat in range(args.repeats):
        for load in ("quiet", "busy"):
            for t in threads:
                before = quiet_load()
                busy = subprocess.Popen(BUSY) if load == "busy" else None
                try:
                    result = train(work, f"{load}_{t}_{repeat}", args.steps, t)
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
                run = {"load": load, "threads": t, "repeat": repeat, "others_before": before, **result}
                if load == "quiet" and before > 0.25:
                    run["note"] = f"not quiet: other processes used {before} cores before it"
                runs.append(run)
                print(
                    f"{load:<5} threads={t:<5} -> {result['threads_used']} thread(s): "
                    f"{result['train_s']:7.1f} s training, {result['process_s']:7.1f} s process"
                    f"{'  (' + run['note'] + ')' if 'note' in run else ''}",
                    flush=True,
                )
    summary = summarize(runs)
    for name, floor in summary["floors"].items():
        verdict = {True: "met", False: "NOT met", None: "not judged: the machine was not quiet"}[floor["met"]]
        print(f"{name}: {floor['ratio']:.3f}x (at most {floor['at_most']}x: {verdict})")
    if args.out:
        report = {
            "command": " ".join(["python", "scripts/busy_machine.py", *(argv if argv is not None else sys.argv[1:])]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {k: v for k, v in describe_machine(0).items() if k != "threads"},  # each run's: in runs
            "steps": args.steps,
            "runs": runs,
            **summary,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
