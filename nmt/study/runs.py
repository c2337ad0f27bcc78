"""A study's inputs: run directories (evaluated into records) and records made before.

    run_dirs, records, skipped = find_inputs([Path("multirun/2024-05-01/12-00-00"), Path("docs/study/x/records")])
    info = read_run_dir(run_dirs[0])          # config, history, steps, epochs, minutes, provenance, finished
    curve = learning_curve(info.history)

A run directory holds checkpoints/best.pt (the checkpoint the study evaluates) and, once training is done,
metrics.json; last.pt (when present) holds the whole training's history. A record is a `*.json.gz` file
written by nmt.study.records; a directory of them (no best.pt in it) is read whole.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from nmt.errors import DataError

log = logging.getLogger(__name__)

BEST = Path("checkpoints") / "best.pt"
RECORD_SUFFIX = ".json.gz"


@dataclass
class RunInfo:
    """What a run directory says about its training (nothing about its translations)."""

    path: Path
    config: dict  # the resolved training config stored in the checkpoint
    history: list[dict]  # the whole training's when last.pt exists, else up to the best checkpoint
    step: int
    epoch: int
    minutes: float
    finished: bool  # metrics.json exists
    best: dict  # {"metric", "value", "step"} of the checkpoint the study evaluates
    provenance: dict  # what trained it (commit, CPU, torch), {} for checkpoints older than the record
    trained_at: str  # when training ended (metrics.json, else the last checkpoint), UTC, as YYYY-MM-DDTHH:MMZ
    # the settings that broke exactness when the run was resumed with trainer.resume_changes=allow (nmt.resume)
    resumed_with_changes: list[str] = field(default_factory=list)
    # why training ended (metrics.json's stopped_by: early_stopping, max_epochs, max_steps, ...); None unfinished
    stopped_by: str | None = None


def _job_order(path: Path) -> tuple[int, str]:
    head = path.name.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, path.name)


def is_record(path: Path) -> bool:
    return path.name.endswith(RECORD_SUFFIX) and path.is_file()


def find_inputs(paths: Sequence[Path]) -> tuple[list[Path], list[Path], list[Path]]:
    """(run directories holding checkpoints/best.pt, record files, subdirectories of a sweep that hold no
    checkpoint yet). Each path is a run directory, a sweep directory, a record, or a directory of records."""
    runs: list[Path] = []
    records: list[Path] = []
    skipped: list[Path] = []
    for p in map(Path, paths):
        if is_record(p):
            records.append(p)
            continue
        if not p.is_dir():
            raise DataError(
                f"{p}: no such directory or record; pass a sweep directory (multirun/<date>/<time>), run "
                f"directories, records (*{RECORD_SUFFIX}) or a directory of records"
            )
        if (p / BEST).is_file():
            runs.append(p)
            continue
        found_records = sorted(f for f in p.iterdir() if is_record(f))
        subdirs = sorted((d for d in p.iterdir() if d.is_dir() and d.name[0] != "."), key=_job_order)
        found = [d for d in subdirs if (d / BEST).is_file()]
        if not found and not found_records:
            raise DataError(
                f"{p}: no runs (no checkpoints/best.pt in it or its subdirectories) and no records "
                f"(*{RECORD_SUFFIX}); pass the directory of an nmt-train multirun, or wait for the first validation"
            )
        records += found_records
        runs += found
        skipped += [d for d in subdirs if (d / ".hydra").is_dir() and d not in found]
    return list(dict.fromkeys(runs)), list(dict.fromkeys(records)), skipped


def read_run_dir(path: Path) -> RunInfo:
    """A run's config, history and progress (from last.pt when present: the whole training so far)."""
    from nmt.checkpoint import load_checkpoint

    last = path / "checkpoints" / "last.pt"
    best = load_checkpoint(path / BEST)
    payload = load_checkpoint(last) if last.is_file() else best
    if not isinstance(payload.get("config"), dict) or not payload["config"].get("data"):
        raise DataError(f"{path}: its checkpoint stores no training config; evaluate it with nmt-evaluate and data=...")
    done = {
        "step": payload.get("step", 0),
        "epoch": payload.get("epoch", 0),
        "train_minutes": round(float(payload.get("elapsed", 0.0)) / 60, 2),
    }
    metrics = path / "metrics.json"  # the finished run's own summary (its epoch count includes the last)
    stopped_by = None
    if metrics.is_file():
        try:
            summary = json.loads(metrics.read_text())
            done.update({k: v for k, v in summary.items() if k in done})
            stopped_by = summary.get("stopped_by")
        except (OSError, ValueError):
            log.warning("%s: unreadable; using the checkpoint's step and epoch", metrics)
    chosen = best.get("best") or {}
    changed = list(payload.get("resumed_with_changes") or best.get("resumed_with_changes") or [])
    if changed:
        log.warning("%s: resumed with changes that break exactness (%s); its record says so", path, ", ".join(changed))
    ended = (metrics if metrics.is_file() else last if last.is_file() else path / BEST).stat().st_mtime
    return RunInfo(
        path,
        payload["config"],
        list(payload.get("history", [])),
        int(done["step"]),
        int(done["epoch"]),
        float(done["train_minutes"]),
        metrics.is_file(),
        {"metric": chosen.get("metric"), "value": chosen.get("value"), "step": best.get("step")},
        dict(best.get("provenance") or {}),
        datetime.fromtimestamp(ended, timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        changed,
        stopped_by,
    )


def validation_curve(history: Sequence[dict]) -> list[list]:
    """Every validation of the training: [[step, epoch, BLEU], ...] (BLEU on the split that chose best.pt)."""
    return [[h["step"], h.get("epoch"), h.get("bleu")] for h in history if h.get("kind") == "valid"]


def learning_curve(history: Sequence[dict]) -> dict:
    """Validation BLEU of the shortest and longest buckets holding >= 10 sentences (else any non-empty):
    {side: {bucket, n, points}} with points [[minutes of training, BLEU, step], ...]. The buckets are the
    run's trainer.length_buckets."""
    valid = [h for h in history if h.get("kind") == "valid" and h.get("by_length")]
    rows = [r for r in valid[0]["by_length"] if r["n"]] if valid else []
    rows = [r for r in rows if r["n"] >= 10] or rows
    out: dict = {}
    for side, row in (("shortest", rows[0]), ("longest", rows[-1])) if rows else ():
        points = []
        for h in valid:
            match = next((r for r in h["by_length"] if r["bucket"] == row["bucket"]), None)
            if match and match["bleu"] is not None:
                points.append([round(float(h.get("elapsed", 0.0)) / 60, 3), match["bleu"], h["step"]])
        out[side] = {"bucket": row["bucket"], "n": row["n"], "points": points}
    return out
