"""python scripts/gpu_steps.py --label NAME [--tokens 2000 16000] [--steps 30] [--device cuda] [--out F] [-- K=V]

Training steps of the `multi30k_deen` preset on a GPU, timed, counted and profiled, with whichever nmt is
installed: scripts/gpu_check.sh runs it once with a base version of the code and once with the version under
test, one after the other on the same GPU. It uses only what both versions have: the Trainer that nmt-train builds
(nmt.cli.common.build_run) and its own step (`_train_step`) over the batches of epoch 0 in training's order.

    PYTHONPATH=/tmp/site-new:/tmp/site-deps python3 scripts/gpu_steps.py --label new --out new.json \\
        -- data.root=.device/data/multi30k paths.data_dir=.device/data

For each --tokens batch size: --warmup steps, the --steps steps once untimed (so that every shape they have was
seen), then the same steps timed with the device synchronised before and after (sentences/s, target tokens/s, ms a
step) and each step between CUDA events (the median and the range); then 3 steps under torch.profiler (kernel
launches a step, GPU-busy time against wall time) and 3 under a dispatch counter (operators a step, and those that
are not views); torch.cuda.max_memory_allocated; and collate's time a batch on the host. The JSON also records the
GPU's name, its 4096^3 bf16 and fp32 matmul rates, torch, and --label. `--device cpu` runs the same on a CPU (the
script's own check: the timings then say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import nmt.cli  # noqa: F401  (sets the CPU memory settings of nmt/memory.py: must come before torch)

# isort: split
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.cli.common import build_run, compose_config
from nmt.data import collate


class Count(TorchDispatchMode):
    """Operators dispatched, and those that are views (defined here: a base version may have no nmt.dispatch)."""

    def __init__(self):
        super().__init__()
        self.total = self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        self.views += func.is_view
        return func(*args, **(kwargs or {}))


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--label", required=True, help="which code this is (base, new, ...): goes into the JSON")
    p.add_argument("--tokens", type=int, nargs="+", default=[2000, 16000], help="trainer.batch_tokens values")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per batch size (default 30)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a check of this script)")
    p.add_argument("--out", help="write the results as JSON to this file")
    return p.parse_args(argv), overrides


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_tflops(device: str, dtype: torch.dtype, n: int = 4096, calls: int = 20) -> float:
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        a @ b
    sync(device)
    return round(2 * n**3 * calls / (time.perf_counter() - start) / 1e12, 2)


def run_steps(trainer, groups: list, start: int, count: int, marks: list | None = None) -> int:
    """Steps start..start+count-1 of `groups` (wrapping around); returns the sentences trained on. With `marks`,
    a mark is appended before the first step and after each (a CUDA event on a GPU, recorded without waiting;
    a clock reading on a CPU)."""
    sentences = 0
    for k in range(count):
        if marks is not None and k == 0:
            marks.append(mark(trainer.device))
        pos = (start + k) % len(groups)
        trainer.batch_pos = pos
        trainer._train_step(groups[pos])
        sentences += sum(map(len, groups[pos]))
        if marks is not None:
            marks.append(mark(trainer.device))
    return sentences


def mark(device: torch.device):
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def step_ms(marks: list) -> list[float]:
    """Each step's milliseconds between consecutive marks (read after the device was synchronised)."""
    if isinstance(marks[0], float):
        return [1000 * (b - a) for a, b in zip(marks, marks[1:], strict=False)]
    return [a.elapsed_time(b) for a, b in zip(marks, marks[1:], strict=False)]


def measure(cfg, device: str, warmup: int, steps: int, work: Path) -> dict:
    trainer = build_run(cfg, work, device)
    groups, split = trainer._groups(0), trainer.train_split
    run_steps(trainer, groups, 0, warmup)
    # the timed steps once untimed: every shape they have is seen before (first-use allocations, kernel choices)
    run_steps(trainer, groups, warmup, steps)
    sync(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    timed = [(warmup + k) % len(groups) for k in range(steps)]
    marks: list = []
    start = time.perf_counter()
    sentences = run_steps(trainer, groups, warmup, steps, marks)
    sync(device)
    seconds = time.perf_counter() - start
    per_step = sorted(step_ms(marks))
    tokens = sum(int(split.tgt_lengths[b].sum()) for pos in timed for b in groups[pos])
    after = warmup + steps
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        wall = time.perf_counter()
        run_steps(trainer, groups, after, 3)
        sync(device)
        wall = time.perf_counter() - wall
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(e.time_range.elapsed_us() for e in kernels)  # one stream: kernels do not overlap
    with Count() as count:
        run_steps(trainer, groups, after + 3, 3)
    sync(device)
    collate_s = []
    for pos in timed[:10]:
        for b in groups[pos]:
            t = time.perf_counter()
            collate(split, b)
            collate_s.append(time.perf_counter() - t)
    return {
        "steps": steps,
        "sentences_per_s": round(sentences / seconds, 1),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "ms_per_step": round(1000 * seconds / steps, 2),
        "ms_per_step_median": round(per_step[len(per_step) // 2], 2),
        "ms_per_step_range": [round(per_step[0], 2), round(per_step[-1], 2)],
        "sentences_per_step": round(sentences / steps, 1),
        "kernel_launches_per_step": round(len(kernels) / 3, 1),
        "gpu_busy_fraction": round(busy_us / 1e6 / wall, 3) if kernels else None,
        "operators_per_step": round(count.total / 3, 1),
        "operators_not_views_per_step": round((count.total - count.views) / 3, 1),
        "top_kernels": Counter(e.name for e in kernels).most_common(12),
        "max_memory_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3)
        if device.startswith("cuda")
        else None,
        "collate_ms_per_batch": round(1000 * sum(collate_s) / len(collate_s), 3),
        "plan": getattr(trainer, "plan", None) and trainer.plan.describe(),
    }


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    report = {
        "label": args.label,
        "device": args.device,
        "torch": str(torch.__version__),
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "runs": {},
    }
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
        report["matmul_4096_tflops"] = {
            "bf16": matmul_tflops(args.device, torch.bfloat16),
            "fp32": matmul_tflops(args.device, torch.float32),
        }
    with tempfile.TemporaryDirectory() as work:
        for tokens in args.tokens:
            settings = [f"trainer.batch_tokens={tokens}", "trainer.progress=false", f"device={args.device}"]
            cfg = compose_config(["experiment=multi30k_deen", *overrides, *settings])
            result = measure(cfg, args.device, args.warmup, args.steps, Path(work) / str(tokens))
            report["runs"][str(tokens)] = result
            print(f"{args.label} {tokens:>6} tokens: {json.dumps(result)}", flush=True)
            if args.out:  # after every batch size: a run cut short still leaves what it measured
                Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
