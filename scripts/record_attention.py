"""How sharp each study record's attention is, from the records alone, beside the run's validation BLEU.

    python scripts/record_attention.py docs/study/caption_windows/records docs/study/caption_windows_fr/records \\
        --out docs/study/converged/attention_by_seed.json

Every record holds one long input's greedy attention weights (`long`: a (T, S) matrix); records made since
`attention_stats` exists also hold teacher-forced statistics over the whole test split. Per record: the long
input's mean entropy per target token (nats; log S is uniform), its mean largest weight, the share of steps whose
most-attended position does not move backwards (monotone), and the teacher-forced statistics where present;
with the run's best validation BLEU and precision, so seeds of one model can be set side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from nmt.study.records import read_record
from nmt.study.runs import find_inputs


def long_input(weights: list[list[float]]) -> dict:
    """Entropy, largest weight and monotone share of one (T, S) attention matrix."""
    rows = [r for r in weights if r]
    entropy = sum(-sum(p * math.log(p) for p in r if p > 0) for r in rows) / len(rows)
    peaks = [max(range(len(r)), key=r.__getitem__) for r in rows]
    forward = sum(b >= a for a, b in zip(peaks, peaks[1:], strict=False)) / max(len(peaks) - 1, 1)
    return {
        "target_pieces": len(rows),
        "source_pieces": len(rows[0]),
        "entropy": round(entropy, 3),
        "uniform_entropy": round(math.log(len(rows[0])), 3),
        "max_weight": round(sum(max(r) for r in rows) / len(rows), 3),
        "monotone": round(forward, 3),
    }


def row(record: dict) -> dict:
    made = record.get("provenance") or {}
    amp = (record.get("config") or {}).get("trainer", {}).get("amp")
    return {
        "name": record["name"],
        "attention": (record.get("config") or {}).get("attention", {}).get("name"),
        "seed": (record.get("config") or {}).get("seed"),
        "best_valid_bleu": (record.get("best") or {}).get("value"),
        "steps": record.get("steps"),
        "precision": f"amp={amp}, native bf16: {made.get('native_bf16')}",
        "commit": (made.get("commit") or "")[:12],
        "long_input": long_input(record["long"]["attention"]) if record["long"].get("attention") else None,
        "attention_stats": record.get("attention_stats"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path, help="records (*.json.gz) or directories of them")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    out = {}
    for folder in args.records:
        _, records, _ = find_inputs([folder])
        out[folder.as_posix()] = [row(read_record(r)) for r in records]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    for folder, rows in out.items():
        print(folder)
        for r in rows:
            li = r["long_input"] or {}
            print(
                f"  {r['name']:16} valid BLEU {r['best_valid_bleu']:6.2f}  long input: entropy {li.get('entropy')} "
                f"of {li.get('uniform_entropy')}, max weight {li.get('max_weight')}, monotone {li.get('monotone')}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
