"""The runs of a bottleneck study: finding them, loading their stored configs, grouping runs that differ
only in the seed, naming the decoder each group really is, and saying how groups differ otherwise.

    run_dirs, skipped = find_runs([Path("multirun/2024-05-01/12-00-00")])
    groups = group_runs([load_run(p) for p in run_dirs])     # [(label, [Run, ...]), ...]
    diff, notes = config_notes(groups)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nmt.errors import DataError
from nmt.study_stats import Output

if TYPE_CHECKING:
    from nmt.translator import Translation

log = logging.getLogger(__name__)

BEST = Path("checkpoints") / "best.pt"
# config keys that do not change what a run learns (prefixes end with ".")
IGNORED_KEYS = (
    "device",
    "paths.",
    "trainer.progress",
    "trainer.resume",
    "trainer.threads",
    "trainer.log_every",
    "trainer.heatmaps",
)


@dataclass
class Run:
    """One training run of the study: what it stored, and (after evaluation) what it translated."""

    path: Path
    config: dict  # the resolved training config stored in the checkpoint
    history: list[dict]  # the whole training's when last.pt exists, else up to the best checkpoint
    step: int
    epoch: int
    minutes: float
    finished: bool  # metrics.json exists
    result: dict = field(default_factory=dict)  # nmt.evaluation.evaluate's result, without the hypotheses
    parameters: int = 0
    long: Translation | None = None  # the long sentence, translated
    has_alignment: bool = True
    outputs: dict[str, Output] = field(default_factory=dict)  # split -> translations and BLEU statistics
    windows: dict[str, dict] = field(default_factory=dict)  # test_k<k> -> {"bleu", "chrf", "sentences", "files"}

    @property
    def attention(self) -> str:
        return str(self.config.get("attention", {}).get("name"))


# ------------------------------------------------------------------------------------------------- runs
def _job_order(path: Path) -> tuple[int, str]:
    head = path.name.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, path.name)


def find_runs(paths: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """(run directories holding checkpoints/best.pt, subdirectories of a sweep that hold none yet)."""
    runs: list[Path] = []
    skipped: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise DataError(
                f"{p}: no such directory; pass a sweep directory (multirun/<date>/<time>) or run directories"
            )
        if (p / BEST).is_file():
            runs.append(p)
            continue
        subdirs = sorted((d for d in p.iterdir() if d.is_dir() and d.name[0] != "."), key=_job_order)
        found = [d for d in subdirs if (d / BEST).is_file()]
        if not found:
            raise DataError(
                f"{p}: no runs (no checkpoints/best.pt in it or its subdirectories); pass the "
                "directory of an nmt-train multirun, or wait for the first validation"
            )
        runs += found
        skipped += [d for d in subdirs if (d / ".hydra").is_dir() and d not in found]
    return list(dict.fromkeys(runs)), skipped


def load_run(path: Path) -> Run:
    """A run's config, history and progress (from last.pt when present: the whole training so far)."""
    from nmt.checkpoint import load_checkpoint

    last = path / "checkpoints" / "last.pt"
    payload = load_checkpoint(last if last.is_file() else path / BEST)
    if not isinstance(payload.get("config"), dict) or not payload["config"].get("data"):
        raise DataError(f"{path}: its checkpoint stores no training config; evaluate it with nmt-evaluate and data=...")
    done = {
        "step": payload.get("step", 0),
        "epoch": payload.get("epoch", 0),
        "train_minutes": round(float(payload.get("elapsed", 0.0)) / 60, 2),
    }
    metrics = path / "metrics.json"  # the finished run's own summary (its epoch count includes the last)
    if metrics.is_file():
        try:
            done.update({k: v for k, v in json.loads(metrics.read_text()).items() if k in done})
        except (OSError, ValueError):
            log.warning("%s: unreadable; using the checkpoint's step and epoch", metrics)
    return Run(
        path,
        payload["config"],
        list(payload.get("history", [])),
        int(done["step"]),
        int(done["epoch"]),
        float(done["train_minutes"]),
        metrics.is_file(),
    )


def flatten(config: dict, prefix: str = "") -> dict:
    """{"trainer.max_steps": 1200, ...}: nested dicts become dotted keys, other values stay as they are."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _ignored(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in IGNORED_KEYS)


def differing_keys(configs: Sequence[dict], skip: Callable[[str], bool] = lambda key: False) -> list[str]:
    """Dotted keys (except ignored and skipped ones) whose values are not the same in all `configs`."""
    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f})
    return [
        k
        for k in keys
        if not _ignored(k) and not skip(k) and len({json.dumps(f.get(k, "<unset>"), sort_keys=True) for f in flat}) > 1
    ]


def decoder_label(config: dict) -> str:
    """Which decoder a run really is, from its stored config: the attention (and its score), the order of
    attention and recurrence (attention.query) and input feeding (model.input_feeding), e.g.
    "none (RNNencdec: context into every step)", "bahdanau (RNNsearch order)",
    "luong general (Luong order, input feeding)"."""
    attention = config.get("attention", {})
    name, query = str(attention.get("name")), attention.get("query")
    if query == "previous":  # the context (for none: the sentence vector) is an input of every LSTM step
        order = "RNNencdec: context into every step" if name == "none" else "RNNsearch order"
    elif query == "current":  # the context joins after each LSTM step: h~ = tanh(W_c [c; h])
        order = "Luong order: context after each step" if name == "none" else "Luong order"
    else:
        order = ""
    parts = [p for p in (order, "input feeding" if config.get("model", {}).get("input_feeding") else "") if p]
    label = name + (f" {attention['score']}" if attention.get("score") else "")
    return label + (f" ({', '.join(parts)})" if parts else "")


def group_runs(runs: Sequence[Run]) -> list[tuple[str, list[Run]]]:
    """Runs whose configs differ only in the seed (and ignored keys), in run order, labelled by decoder_label
    (plus the keys that set a group apart from others with the same label)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        flat = flatten(run.config)
        key = json.dumps({k: v for k, v in flat.items() if k != "seed" and not _ignored(k)}, sort_keys=True)
        groups.setdefault(key, []).append(run)
    labelled = []
    for members in groups.values():
        label = decoder_label(members[0].config)
        same = [g for g in groups.values() if decoder_label(g[0].config) == label]
        if len(same) > 1:  # the same decoder twice: name what sets this group apart
            keys = differing_keys([g[0].config for g in same], lambda k: k == "seed")
            flat = flatten(members[0].config)
            label += " (" + ", ".join(f"{k}={flat.get(k)}" for k in keys) + ")"
        labelled.append((label, members))
    return labelled


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


def config_notes(groups: Sequence[tuple[str, list[Run]]]) -> tuple[dict, list[str]]:
    """({key: {group label: value}} for keys other than the attention's that differ, notes saying so)."""
    keys = differing_keys(
        [members[0].config for _, members in groups], lambda k: k.startswith("attention.") or k == "seed"
    )
    diff = {k: {label: flatten(members[0].config).get(k) for label, members in groups} for k in keys}
    seeds = {label: sorted({r.config.get("seed") for r in members}) for label, members in groups}
    notes = []
    if diff:
        listed = "; ".join(
            f"`{k}` (" + ", ".join(f"{lab}: {v}" for lab, v in vals.items()) + ")" for k, vals in diff.items()
        )
        notes.append(f"The runs differ in more than the attention, so compare with care: {listed}.")
    else:
        notes.append(
            "The runs differ only in the attention"
            + (" and the seed." if any(len(v) > 1 for v in seeds.values()) else ".")
        )
    if len({json.dumps(v) for v in seeds.values()}) > 1:
        listed = "; ".join(f"{k}: {v}" for k, v in seeds.items())
        notes.append(f"Seeds differ between attention types: {listed}.")
    return diff, notes
