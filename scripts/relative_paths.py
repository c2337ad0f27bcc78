"""python scripts/relative_paths.py FILE.json [FILE.json ...] [--shared DIR]

Rewrites a measurement's JSON before it is committed, so that it records no path of the machine that made it:

- the shared folder beside the clone (`--shared`, default: ../shared from this checkout, resolved) becomes
  `../shared/...`;
- an interpreter or command in a virtual environment (`/x/.venv/bin/python`, `/x/.venv/bin/nmt-translate`)
  becomes its name;
- a script of any checkout (`/x/wt/scripts/benchmark.py`) becomes `scripts/benchmark.py`;
- `--out PATH` in a command becomes the file as committed (its path in this repository);
- any other absolute path under a scratch folder (/tmp, /work, /home, /root, /scratch, /mnt, /srv, /var/tmp)
  has that folder and the one under it replaced by `WORK` (a run's scratch folder: a temporary one unless the
  command's --work named one): /tmp/b1/run/last.pt becomes WORK/run/last.pt.

tests/test_benchmark_files.py fails on a committed file that still has such a path.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a scratch root and the folder under it (the rest of the path stays: WORK/run/checkpoints/last.pt)
SCRATCH = re.compile(r"(?<![\w.])/(?:tmp|work|home|root|Users|scratch|mnt|srv|var/tmp)/[^\s/\"',;)]+")


def relative(text: str, shared: str, committed: str) -> str:
    """One string with the machine's paths rewritten (see the module's docstring)."""
    text = re.sub(r"(--out )\S+", lambda m: m[1] + committed, text)
    text = text.replace(shared.rstrip("/") + "/", "../shared/")
    text = re.sub(r"(?<![\w.])/\S*/\.venv/bin/([\w.-]+)", r"\1", text)
    text = re.sub(r"(?<![\w.])/\S*/scripts/([\w-]+\.py)", r"scripts/\1", text)
    return SCRATCH.sub("WORK", text)


def rewrite(value, shared: str, committed: str):
    if isinstance(value, dict):
        return {key: rewrite(item, shared, committed) for key, item in value.items()}
    if isinstance(value, list):
        return [rewrite(item, shared, committed) for item in value]
    return relative(value, shared, committed) if isinstance(value, str) else value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--shared", default=str((ROOT / ".." / "shared").resolve()), help="the shared folder's path here")
    args = p.parse_args(argv)
    for path in args.files:
        text = path.read_text(encoding="utf-8")
        indent = 1 if text.startswith("{\n ") and not text.startswith("{\n  ") else 2
        try:
            committed = path.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            committed = path.name
        report = rewrite(json.loads(text), args.shared, committed)
        path.write_text(json.dumps(report, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{path}: relative paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
