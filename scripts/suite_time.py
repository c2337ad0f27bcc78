"""python scripts/suite_time.py --out docs/benchmark/test_suite_<where>.json [-- pytest arguments]

Runs the test suite as CI does (`python -m pytest -q`, or the arguments after --) and records how long it took,
pytest's summary line, the machine (nmt.device.describe_machine) and the load average before and after (other
work on the cores shows there). scripts/readme_tables.py writes the README's line on the suite's time from the
newest such file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from nmt.provenance import describe_machine

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    p.add_argument("--out", type=Path, required=True, help="the JSON report")
    p.add_argument("pytest_args", nargs="*", help="pytest's arguments (default: -q)")
    args = p.parse_args(argv)
    command = ["python", "-m", "pytest", *(args.pytest_args or ["-q"])]
    before = os.getloadavg()
    start = time.perf_counter()
    run = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    report = {
        "command": shlex.join(command),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": describe_machine(0),
        "load_average_before": [round(x, 2) for x in before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(seconds, 1),
        "returncode": run.returncode,
        "summary": lines[-1].strip("= ") if lines else "no output",
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=1))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
