"""python scripts/first_run.py --out FIRST_RUN.json [--sentence TEXT] [-- nmt-train overrides]

The README's "A first run", measured as a newcomer meets it: `nmt-train` with the given overrides (default
`experiment=multi30k_deen trainer.max_minutes=5`) in a fresh folder, from start to exit, then `nmt-translate`
with the run's best.pt on one sentence. Written to --out as JSON, from which scripts/readme_tables.py writes the
README's figures:

    python scripts/first_run.py --out docs/benchmark/first_run_multi30k_fp32_avx2-epyc.json \\
        -- experiment=multi30k_deen trainer.max_minutes=5 data.root=../shared/data/multi30k

It records the whole process's seconds and peak resident memory (the largest of its processes), what
metrics.json says (steps, epochs, minutes of training, the last validation's BLEU, the thread count trainer.threads
chose and why), the translation and its whole command's seconds, the machine (nmt.device.describe_machine) and the
load average before and after (a shared machine shows there). A relative `data.root` is resolved from where this
script runs and recorded as given; the command is recorded as typed, with no path of this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from nmt.provenance import describe_machine

BIN = Path(sys.executable).parent
DEFAULT = ["experiment=multi30k_deen", "trainer.max_minutes=5"]
SENTENCE = "Ein Mann fährt mit dem Fahrrad die Straße entlang."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the JSON report")
    p.add_argument("--sentence", default=SENTENCE, help="what nmt-translate translates after training")
    p.add_argument("--work", type=Path, default=None, help="the fresh folder to run in (default: a temporary one)")
    p.add_argument("overrides", nargs="*", help="nmt-train overrides (after --)")
    args = p.parse_args(argv)
    args.overrides = args.overrides or list(DEFAULT)
    return args


def resolved(overrides: list[str]) -> list[str]:
    """The overrides with a relative data.root made absolute from here (the run starts in another folder)."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if key == "data.root" and sep and value and not Path(value).is_absolute():
            item = f"{key}={Path(value).resolve()}"
        out.append(item)
    return out


def peak_children_gib() -> float:
    """The largest resident set of any finished child process so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="first_run_"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    start = time.perf_counter()
    train = subprocess.run([str(BIN / "nmt-train"), *resolved(args.overrides)], cwd=work, text=True)
    train_s = time.perf_counter() - start
    if train.returncode != 0:
        print(f"first_run: error: nmt-train exited with {train.returncode} in {work}", file=sys.stderr)
        return 1
    peak = peak_children_gib()
    (summary_path,) = work.glob("outputs/*/*/metrics.json")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    best = Path(summary["best_checkpoint"])
    start = time.perf_counter()
    translated = subprocess.run(
        [str(BIN / "nmt-translate"), str(best), args.sentence], cwd=work, capture_output=True, text=True
    )
    translate_s = time.perf_counter() - start
    final = summary.get("final") or {}
    report = {
        "command": shlex.join(["nmt-train", *args.overrides]),
        "translate_command": shlex.join(["nmt-translate", "outputs/<date>/<time>/checkpoints/best.pt", args.sentence]),
        "written_by": "python scripts/first_run.py",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": describe_machine(int((summary.get("threads") or {}).get("count") or 0)),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "process_s": round(train_s, 1),
        "peak_rss_gib": round(peak, 3),
        "steps": summary["step"],
        "epochs": summary["epoch"],
        "train_minutes": summary["train_minutes"],
        "stopped_by": summary["stopped_by"],
        "valid_bleu_last": final.get("bleu"),
        "threads": summary.get("threads"),
        "parameters": summary.get("parameters"),
        "translation": translated.stdout.strip() if translated.returncode == 0 else None,
        "translate_s": round(translate_s, 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
