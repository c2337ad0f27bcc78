"""Learning curves of pilot runs, from their train.log, as one JSON file (how a study's budget rule was chosen).

    python scripts/pilot_curves.py RUN_DIR [RUN_DIR...] --out docs/study/converged/pilots.json

Per run directory: every validation (step, epoch, validation loss, BLEU, chrF; the learning rate, the mean
gradient norm and the training loss over the last logged steps before it) as `nmt-train` logged them, and what a
budget rule "stop after `patience` validations without a new best" would have done on this curve for each
patience: the step it stops at, its best step and BLEU, and the BLEU the curve still reached later (a rule that
stops too soon leaves that on the table). The runs' config (trainer.patience 0: never stopped early) comes from
the checkpoint's stored config when present.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

VALID = re.compile(
    r"validation at step (?P<step>\d+)\S*: loss (?P<loss>[\d.]+) ppl [\d.]+ BLEU (?P<bleu>[\d.]+) chrF (?P<chrf>[\d.]+)"
)
TRAIN = re.compile(
    r"step (?P<step>\d+) epoch (?P<epoch>\d+) loss (?P<loss>[\d.]+) lr (?P<lr>[\d.e+-]+) grad_norm (?P<g>[\d.]+)"
)


def read_log(path: Path) -> list[dict]:
    """Every validation of a train.log with the training figures logged since the previous one."""
    rows, since = [], []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if m := TRAIN.search(line):
            since.append(m)
        elif m := VALID.search(line):
            row = {"step": int(m["step"]), "loss": float(m["loss"]), "bleu": float(m["bleu"]), "chrf": float(m["chrf"])}
            if since:
                row |= {
                    "epoch": int(since[-1]["epoch"]),
                    "lr": float(since[-1]["lr"]),
                    "train_loss": round(sum(float(t["loss"]) for t in since) / len(since), 4),
                    "grad_norm": round(sum(float(t["g"]) for t in since) / len(since), 4),
                }
            if not rows or rows[-1]["step"] != row["step"]:  # a resumed run logs its last validation again
                rows.append(row)
            since = []
    return rows


def replay(curve: list[dict], patience: int) -> dict:
    """What early stopping with `patience` would have done on `curve` (BLEU, higher is better)."""
    best, bad = None, 0
    for i, row in enumerate(curve):
        if best is None or row["bleu"] > best["bleu"]:
            best, bad = row, 0
        else:
            bad += 1
        if bad >= patience:
            later = max((r["bleu"] for r in curve[i + 1 :]), default=None)
            return {"stops_at": row["step"], "best_step": best["step"], "best_bleu": best["bleu"], "later_max": later}
    return {"stops_at": None, "best_step": best["step"] if best else None, "best_bleu": best and best["bleu"]}


def best_attention(run: Path, data_root: str) -> dict | None:
    """Teacher-forced attention statistics of the run's best.pt on its corpus's validation split."""
    import torch

    from nmt.checkpoint import load_checkpoint
    from nmt.corpora.multi30k import load_multi30k
    from nmt.study.attention_stats import attention_statistics
    from nmt.translator import Translator

    torch.set_num_threads(1)
    payload = load_checkpoint(run / "checkpoints" / "best.pt")
    translator = Translator.from_payload(payload, "cpu", checkpoint=None)
    src = ((payload.get("config") or {}).get("data") or {}).get("src_lang", "de")
    corpus = load_multi30k(root=data_root, src_lang=src)
    stats = attention_statistics(translator.model, translator.tokenizer, corpus.splits["valid"])
    return stats and {"step": payload.get("step"), **stats}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (each with train.log)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--patience", default="2,3,4,5,6,8", help="patiences to replay (default: 2,3,4,5,6,8)")
    p.add_argument(
        "--data-root",
        default=None,
        help="Multi30k's raw files: also record each run's best.pt attention statistics on the validation split "
        "(nmt.study.attention_stats, teacher-forced)",
    )
    args = p.parse_args(argv)
    out = {}
    for run in args.runs:
        log = run / "train.log"
        if not log.is_file():
            p.error(f"{log}: no train.log; pass run directories of nmt-train")
        curve = read_log(log)
        out[run.name] = {
            "validations": curve,
            "replay": {str(k): replay(curve, int(k)) for k in args.patience.split(",")},
        }
        if args.data_root:
            out[run.name]["attention_stats"] = best_attention(run, args.data_root)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    for name, r in out.items():
        last = r["validations"][-1] if r["validations"] else {}
        print(f"{name}: {len(r['validations'])} validations, last step {last.get('step')} BLEU {last.get('bleu')}")
        for k, rep in r["replay"].items():
            print(f"  patience {k}: {rep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
