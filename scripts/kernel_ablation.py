"""What each kernel buys in whole runs: the preset's training with each kernel turned off in turn, beside an A/A
pair (the same plan twice) that measures the noise, in fresh processes, repeated.

    python scripts/kernel_ablation.py --data ../shared/data/multi30k --seconds 150 --repeats 3 \\
        --out docs/benchmark/kernel_ablation.json

Every repeat runs, one process each and in a rotated order, the plan `kernels=auto` picks for the preset on this
machine (A), each of its training kernels (those the warm-up run's plan has on) turned off alone
(`trainer.kernels_off=[name]`: that component's torch form, nmt.plan), and A again (A'). A run trains for
`--seconds` of wall clock with no validation inside the budget (its final validation is outside it, on
--valid-sentences sentences); its rate is target tokens over those seconds, and its 50-step windows, page faults
and neighbours are recorded (nmt.health), so a window that another program slowed is seen. A kernel pays its way
where turning it off costs more than the A/A noise (the largest relative difference of an A/A pair) or 2%, the
larger: the JSON's `verdicts`. One warm-up run first fills the disk caches (built kernels, Inductor's
compilations, the prepared corpus). It needs a quiet machine: the report flags runs whose windows spread more
than 25% or that shared their cores.

--preset quick --data "" --seconds 5 --repeats 1 --warmup-seconds 5 proves the script in minutes (numbers
that mean nothing). Python and the
commands it runs: this checkout's (sys.executable).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import torch

from nmt.cli.common import build_run, compose_config, load_data
from nmt.health import Windows, health
from nmt.plan import KERNEL_COMPONENTS
from nmt.provenance import describe_machine

TRAINING_KERNELS = [k for k in KERNEL_COMPONENTS if k != "beam_topk"]  # top k runs in searches only
NOISE_FLOOR = 0.02  # a kernel must buy more than this, or than the A/A spread


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="multi30k_deen", help="configs/experiment/<preset>.yaml")
    p.add_argument("--data", default="../shared/data/multi30k", help="data.root for a preset that reads files")
    p.add_argument("--seconds", type=float, default=150.0, help="training wall clock of each run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--valid-sentences", type=int, default=100, help="the final validation's sentences")
    p.add_argument("--kernels", default=",".join(TRAINING_KERNELS), help="comma-separated kernels to turn off")
    p.add_argument("--warmup-seconds", type=float, default=30.0, help="the uncounted first run (0: none)")
    p.add_argument("--work", default=None, help="run directories and the prepared corpus (default: a temp dir)")
    p.add_argument("--out", default="kernel_ablation.json")
    p.add_argument("--override", action="append", default=[], help="another config override (repeatable)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one run, its JSON to stdout
    return p.parse_args(argv)


def overrides(args: argparse.Namespace, work: Path, off: list[str], seconds: float) -> list[str]:
    """The preset's training for `seconds`, `off` turned off, no validation inside the budget."""
    source = [f"paths.data_dir={work / 'data'}"] + ([f"data.root={Path(args.data).resolve()}"] if args.data else [])
    return [
        f"experiment={args.preset}",
        *source,
        f"trainer.max_minutes={seconds / 60}",
        "trainer.valid_every=1000000000",
        f"trainer.valid_max_sentences={args.valid_sentences}",
        f"trainer.threads={args.threads}",
        "trainer.progress=false",
        "trainer.heatmaps=0",
        f"trainer.kernels_off=[{','.join(off)}]",
        *args.override,
    ]


def one_run(args: argparse.Namespace) -> dict:
    """Train once in this process (--one: the JSON spec of the run) and measure it."""
    spec = json.loads(args.one)
    work, run_dir = Path(spec["work"]), Path(spec["run_dir"])
    cfg = compose_config(overrides(args, work, spec["off"], spec["seconds"]))
    data = load_data(cfg)
    windows = Windows()
    trainer = build_run(cfg, run_dir, "cpu", data, hooks=[windows])
    summary = trainer.train()
    windows.close(trainer.step)
    tokens = sum(r["target_tokens_per_s"] * r["seconds"] for r in windows.records)
    return {
        "off": spec["off"],
        "train_seconds": round(trainer.elapsed, 2),
        "steps": summary["step"],
        "target_tokens_per_s": round(tokens / max(trainer.elapsed, 1e-9), 1),
        "health": health(windows.records, torch.get_num_threads()),
        "windows": windows.records,
        "plan": summary["plan"],
        "kernels_on": sorted(trainer.stepper.run_plan.kernels),
        "fallbacks": summary["fallbacks"],
    }


def spawn(args: argparse.Namespace, work: Path, name: str, off: list[str], seconds: float) -> dict:
    """One run in a fresh process (its own allocator, caches loaded from disk as any run's are)."""
    spec = {"work": str(work), "run_dir": str(work / "runs" / name), "off": off, "seconds": seconds}
    cmd = [sys.executable, __file__, "--one", json.dumps(spec), *sys.argv[1:]]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run {name} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(name=name, process_seconds=round(time.perf_counter() - start, 1))
    print(f"{name}: {result['target_tokens_per_s']:,.0f} target tokens/s; {result['health']['flags']}", flush=True)
    return result


def schedule(kernels: list[str], repeats: int) -> list[tuple[int, str, list[str]]]:
    """(repeat, name, off) in run order: per repeat A, each kernel off, A', rotated a place each repeat."""
    runs = []
    for r in range(repeats):
        middle = [(f"off_{k}", [k]) for k in kernels]
        shift = r % max(len(middle), 1)
        middle = middle[shift:] + middle[:shift]
        runs += [(r, name, off) for name, off in [("A", []), *middle, ("A_again", [])]]
    return runs


def verdicts(runs: list[dict], kernels: list[str]) -> dict:
    """Per repeat, each run's rate over the mean of its A/A pair; the A/A spread; each kernel's median cost."""
    by_repeat: dict[int, dict[str, float]] = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], {})[run["name"]] = run["target_tokens_per_s"]
    aa, costs = [], {k: [] for k in kernels}
    for rates in by_repeat.values():
        a, b = rates["A"], rates["A_again"]
        base = (a + b) / 2
        aa.append(abs(a - b) / base)
        for k in kernels:
            costs[k].append(1 - rates[f"off_{k}"] / base)
    noise = max(max(aa), NOISE_FLOOR)
    result = {"aa_spread": [round(x, 4) for x in aa], "threshold": round(noise, 4), "kernels": {}}
    for k, c in costs.items():
        cost = statistics.median(c)
        result["kernels"][k] = {
            "cost_when_off": [round(x, 4) for x in c],
            "median_cost": round(cost, 4),
            "pays": cost > noise,
        }
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args)))
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="nmt-ablation-")).resolve()
    kernels = [k for k in args.kernels.split(",") if k]
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "args": {k: v for k, v in vars(args).items() if k != "one"},
        "machine": describe_machine(args.threads),
        "runs": [],
    }
    if args.warmup_seconds > 0:
        report["warmup"] = spawn(args, work, "warmup", [], args.warmup_seconds)
        unused = [k for k in kernels if k not in report["warmup"]["kernels_on"]]
        report["not_in_the_plan"] = unused  # nothing to turn off (another model, precision, or no compiler)
        kernels = [k for k in kernels if k not in unused]
    for repeat, name, off in schedule(kernels, args.repeats):
        run = spawn(args, work, f"{name}_r{repeat}", off, args.seconds)
        run.update(name=name, repeat=repeat)
        report["runs"].append(run)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")  # partial runs survive
    report["verdicts"] = verdicts(report["runs"], kernels)
    report["flagged_runs"] = [f"{r['name']} r{r['repeat']}" for r in report["runs"] if r["health"]["flags"]]
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for k, v in report["verdicts"]["kernels"].items():
        print(f"{k}: costs {v['median_cost']:+.1%} when off ({'pays' if v['pays'] else 'within the noise'})")
    print(f"A/A spread {report['verdicts']['aa_spread']}; flagged runs: {report['flagged_runs'] or 'none'}")
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
