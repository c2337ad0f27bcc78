"""python scripts/step_ops.py [--plan cuda|cpu] [--tokens 2000 16000] [--batches 8] [--data DIR] [--out F] [-- K=V]

How many operators a training step of the `multi30k_deen` preset dispatches under a device's plan
(nmt.device_plan), counted on this CPU: on a CUDA GPU each operator that is not a view is a kernel launch, and
a profile on an H200 found the step bound by them. The steps are the Trainer's own (`_train_step`) on the batches of
epoch 0, in training's order, at each --tokens batch size:

    python scripts/step_ops.py                      # the GPU's plan: the loss and the energy in one piece each
    python scripts/step_ops.py --plan cpu           # the CPU's: cache-sized pieces, as the CPU trains
    python scripts/step_ops.py -- trainer.amp=off   # fp32 (the preset computes in bf16 where the CPU has it)

Each step is counted after the step before it (so that a plan that prefetches has its batches prepared by the
feed's thread, which the count does not see; under the CPU's plan the count includes the batch's collation, a
few dozen operators). Per step it prints the sentences, target tokens and target length T, the operators
dispatched (`total`), those that are not views (`launches`), and any that read the device's data back
(`reads`, nmt.dispatch); then the mean and the largest per batch size, and the ratio of the means. Counting
takes a few seconds a step at 16,000 tokens on 2 cores; the counts do not depend on the machine's speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import nmt.cli  # noqa: F401  (sets the CPU memory settings of nmt/memory.py: must come before torch)

# isort: split
import torch

from nmt.cli.common import build_run, compose_config, user_errors
from nmt.device_plan import PLANS
from nmt.dispatch import DispatchCount
from nmt.provenance import describe_machine


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--plan", choices=sorted(PLANS), default="cuda", help="whose plan the steps run under (cuda)")
    p.add_argument("--tokens", type=int, nargs="+", default=[2000, 16000], help="trainer.batch_tokens values")
    p.add_argument("--batches", type=int, default=8, help="steps counted per batch size (default 8)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; counts do not depend on it)")
    p.add_argument("--data", default="../shared/data/multi30k", help="Multi30k raw files; '' for another corpus")
    p.add_argument("--out", help="also write the counts as JSON to this file")
    args = p.parse_args(argv)
    if args.batches < 1 or args.threads < 1 or min(args.tokens) < 1:
        p.error("--batches, --threads and --tokens must be positive")
    return args, overrides


def count_steps(cfg, plan, batches: int, work: Path) -> list[dict]:
    """The counts of `batches` steps (after one uncounted step) of the Trainer `cfg` builds, under `plan`."""
    trainer = build_run(cfg, work, "cpu")
    trainer.use_plan(plan)
    groups = trainer._groups(0)
    split, rows = trainer.train_split, []
    for pos in range(min(batches + 1, len(groups))):
        trainer.batch_pos = pos
        with DispatchCount() as count:
            trainer._train_step(groups[pos])
        if pos == 0:
            continue
        indices = [i for batch in groups[pos] for i in batch]
        rows.append(
            {
                "sentences": len(indices),
                "target_tokens": int(split.tgt_lengths[indices].sum()),
                "T": int(split.tgt_lengths[indices].max()),
                "total": count.total,
                "launches": count.launches,
                "reads": count.reads,
                "top": count.by_op.most_common(8),
            }
        )
        print(
            f"{cfg.trainer.batch_tokens:>6} tokens  step {pos}: {len(indices):4d} sentences, T {rows[-1]['T']:3d}, "
            f"{count.total:6d} operators, {count.launches:6d} not views, reads {count.reads or 'none'}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    torch.set_num_threads(args.threads)
    plan = replace(PLANS[args.plan], device="cpu", pin_memory=False)  # pinned memory needs CUDA
    data = [f"data.root={args.data}"] if args.data else []
    report = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "plan": args.plan,
        "machine": describe_machine(args.threads),
        "runs": {},
    }
    with user_errors(), tempfile.TemporaryDirectory() as work:
        for tokens in args.tokens:
            settings = [f"trainer.batch_tokens={tokens}", "trainer.progress=false"]
            cfg = compose_config(["experiment=multi30k_deen", *data, *overrides, *settings])
            report["runs"][tokens] = count_steps(cfg, plan, args.batches, Path(work) / str(tokens))
    print(f"\nunder the {args.plan} plan, per step (mean / largest):")
    means = {}
    for tokens, rows in report["runs"].items():
        means[tokens] = {k: sum(r[k] for r in rows) / len(rows) for k in ("total", "launches")}
        largest = {k: max(r[k] for r in rows) for k in ("total", "launches")}
        print(
            f"  {tokens:>6} tokens: {means[tokens]['total']:8.0f} / {largest['total']:6d} operators, "
            f"{means[tokens]['launches']:8.0f} / {largest['launches']:6d} not views"
        )
        report["runs"][tokens] = {"steps": rows, "mean": means[tokens], "largest": largest}
    low, high = min(means), max(means)
    if low != high:
        ratio = means[high]["launches"] / means[low]["launches"]
        print(f"  not views at {high} / at {low} tokens: {ratio:.2f}x")
        report["launch_ratio"] = round(ratio, 3)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
