"""python scripts/memory_trace.py [--seconds 240] [--threads 2] [--out FILE] [KEY=VALUE ...]

Where a training run's memory goes, step by step: trains the `multi30k_deen` preset as scripts/benchmark.py
does (no validation until the end; --tiny: a small `quick` run, for the tests) and after every optimizer step
records the process's resident memory and, on Linux with glibc, the heap's bytes in use, its free bytes (held by
the process but not in use: fragmentation) and the bytes in separately mapped blocks:

    python scripts/memory_trace.py --out /tmp/trace.json                  # with nmt/memory.py's settings
    NMT_TUNE_ALLOCATOR=0 python scripts/memory_trace.py --out /tmp/raw.json   # without them, to compare
    python scripts/memory_trace.py --seconds 60 trainer.amp=off           # any override of the train config

It prints a line every --every steps and a summary (steps, sentences/s, peak resident memory, and the heap
in use and free at the end); --out writes the summary and every step's figures as JSON. Memory figures are
MiB; the peak is ru_maxrss, which includes data preparation.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import nmt.cli  # noqa: F401  (applies nmt/memory.py's settings: must come before torch)

# isort: split
import torch

from nmt.cli.common import build_run, compose_config, user_errors
from nmt.device import resolve_device
from nmt.memory import VARIABLES, heap_bytes, tune_allocator
from nmt.trainer import TrainerHook

MIB = 2**20
PRESET = ["experiment=multi30k_deen"]  # scripts/benchmark.py's
TINY = ["experiment=quick", "data.train_size=400", "data.valid_size=20", "data.test_size=20"]  # seconds
ENVIRONMENT = (*VARIABLES, "OMP_NUM_THREADS")  # recorded in the JSON as they were


def heap_reader():
    """A function returning (in use, free, mapped) heap MiB, or None where glibc's mallinfo2 is missing."""
    if heap_bytes() is None:
        return None

    def read() -> tuple[float, float, float]:
        return tuple(n / MIB for n in heap_bytes())

    return read


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides of the train config")
    p.add_argument("--seconds", type=float, default=240.0, help="training wall-clock budget")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default="../shared/data/multi30k", help="folder of the Multi30k .gz files")
    p.add_argument("--work", default=None, help="scratch folder (default: a new temporary folder)")
    p.add_argument("--every", type=int, default=50, help="print a line every this many steps")
    p.add_argument("--out", default=None, help="write the trace here (JSON)")
    p.add_argument("--tiny", action="store_true", help="the benchmark's synthetic task and tiny model (tests)")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.every < 1:
        p.error("--seconds must be positive and --every at least 1")
    if not Path("/proc/self/statm").exists():
        p.error("resident memory is read from /proc/self/statm: Linux only")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="nmt-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    data = [f"paths.data_dir={work / 'data'}"] if args.tiny else [f"data.root={Path(args.data).resolve()}"]
    overrides = [
        *(TINY if args.tiny else PRESET),
        *data,
        f"trainer.max_minutes={args.seconds / 60}",
        "trainer.max_steps=null",
        "trainer.valid_every=1000000",
        f"trainer.threads={args.threads}",
        "trainer.progress=false",
        "trainer.heatmaps=0",
        *args.overrides,
    ]  # validation only at the end
    cfg = compose_config(overrides)
    torch.set_num_threads(args.threads)
    heap = heap_reader()
    steps: list[dict] = []
    sentences_seen = [0]
    start = time.perf_counter()

    class Trace(TrainerHook):
        def on_step(self, trainer, seconds, sentences, tokens, skipped):
            sentences_seen[0] += sentences
            row = {"seconds": round(time.perf_counter() - start, 2), "resident": round(resident_mib(), 1)}
            if heap is not None:
                row.update(zip(("heap_in_use", "heap_free", "mapped"), (round(v, 1) for v in heap()), strict=True))
            steps.append(row)
            if len(steps) % args.every == 0:
                print(f"step {len(steps)}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)

    trainer = build_run(cfg, work / "run", resolve_device(cfg.device), hooks=[Trace()])
    trainer.train()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    summary = {
        "command": " ".join([sys.executable, *sys.argv]),
        "overrides": overrides,
        "allocator": tune_allocator(),  # what nmt/memory.py set; then the variables as they were
        "environment": {k: os.environ.get(k) for k in ENVIRONMENT},
        "steps": len(steps),
        "sentences_per_s": round(sentences_seen[0] / max(trainer.elapsed, 1e-9), 2),
        "peak_resident_mib": round(peak_mib),
        "end": steps[-1] if steps else None,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({**summary, "trace": steps}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    with user_errors():  # a missing corpus or a bad override: one line, not a traceback
        sys.exit(main())
