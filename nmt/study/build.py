"""The bottleneck study: records of runs that differ only in the attention, compared by window size k (the
same test content joined k at a time) and by source length, with seeds, paired tests and the interaction.

    settings = StudySettings(split="test", bootstrap=1000)
    summary = run_study([Path("multirun/2024-05-01/12-00-00")], load_corpus, Path("docs/study/x"), settings)

Inputs are run directories (each evaluated into a record: nmt.study.records) or records made before, in any
mix; everything after that is computed from records alone, so a study rebuilt from its records equals the
one built from the run directories, file for file. The output directory gets records/<run>.json.gz,
study.json, study.md and the figures (nmt.study.report). `load_corpus(config)` rebuilds a run's corpus
from its stored config; the command supplies it, so this module needs no config library.

Refused: the training split, the split that chose each checkpoint (valid and its windows), a split given
twice, runs that differ in more than the attention and the seed, records evaluated on other references,
the same run or the same (model, seed) twice, and fewer than MIN_SAMPLES resamples.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nmt.errors import ConfigError, DataError
from nmt.metrics import bucket_labels, bucket_of, check_edges
from nmt.study.configs import check_comparable, decoder_label, flatten
from nmt.study.records import RecordSettings, StudyRun, make_record, read_record, write_record
from nmt.study.report import write_study
from nmt.study.runs import find_inputs, read_run_dir
from nmt.study.stats import (
    BASELINE,
    MIN_SAMPLES,
    SEED,
    Draws,
    Output,
    add_holm,
    interaction,
    paired_cell,
    seed_cell,
    seed_draws,
)

log = logging.getLogger(__name__)
CANDIDATE_EDGES = (
    [0, 10, 20, 30, 40, 50],
    [0, 10, 20, 30, 40],
    [0, 15, 25, 35, 45],
    [0, 10, 20, 30],
    [0, 15, 25, 35],
    [0, 20, 30],
)  # finest first
SELECTION = re.compile(r"valid(_k\d+)?")  # the splits training validated on (best.pt, early stopping)
RECORD = "study_record.json.gz"  # a run directory's cached record (nmt-study writes it; best.pt newer: made anew)
DECODING_MAY_DIFFER = ("precision", "precision_reason", "max_src_pieces", "device")  # the machine's, not the method's


@dataclass
class StudySettings:
    split: str = "test"
    edges: list[int] | None = None  # None: chosen from CANDIDATE_EDGES
    min_bucket: int = 80  # items every bucket needs when the edges are chosen automatically
    bootstrap: int = MIN_SAMPLES  # resamples for intervals and tests
    seed: int = SEED  # the resampling seed
    record: RecordSettings = field(default_factory=RecordSettings)


# ------------------------------------------------------------------------------------------------ checks
def check_split(split: str) -> str:
    """The split to study: one held-out split, not train and not the one that chose each checkpoint."""
    parts = split.split("+")
    if len(parts) != len(set(parts)):
        raise ConfigError(f"--split {split}: a split is given twice; give one held-out split, e.g. --split test")
    if len(parts) > 1:
        raise ConfigError(f"--split {split}: give one held-out split (its windows <split>_k<k> come with it)")
    if split == "train" or split.startswith("train_"):
        raise ConfigError(f"--split {split}: the runs trained on it; study a held-out split, e.g. --split test")
    if SELECTION.fullmatch(split):
        raise ConfigError(
            f"--split {split}: valid chose each run's best.pt (and timed its early stopping and learning-rate "
            "cuts), so a study on it favours every run by its luckiest checkpoint; use --split test"
        )
    return split


def check_records(records: Sequence[dict]) -> None:
    """Records one study may combine: distinct runs and (model, seed)s, the same split, sets and references,
    the same decoding method, configs that differ only in the attention and the seed."""
    names = [r["name"] for r in records]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise DataError(f"run {twice} is given twice (as a run directory or a record); give each run once")
    first = records[0]
    for r in records[1:]:
        if r["split"] != first["split"] or sorted(r["sets"]) != sorted(first["sets"]):
            raise DataError(
                f"records {first['name']} and {r['name']} were evaluated on different sets "
                f"({', '.join(sorted(first['sets']))} / {', '.join(sorted(r['sets']))}); evaluate them on one split"
            )
        for name, s in r["sets"].items():
            if s["references_sha256"] != first["sets"][name]["references_sha256"]:
                raise DataError(
                    f"records {first['name']} and {r['name']} have different references for {name} "
                    f"(sha256 {first['sets'][name]['references_sha256'][:12]} / {s['references_sha256'][:12]}); "
                    "a study compares translations of the same test set"
                )
        a, b = ({k: v for k, v in x["decoding"].items() if k not in DECODING_MAY_DIFFER} for x in (first, r))
        if a != b:
            raise DataError(f"records {first['name']} and {r['name']} were decoded differently ({a} / {b})")
    check_comparable([r["config"] for r in records], names)
    seen: dict = {}
    for r in records:
        key = (json.dumps(r["config"].get("attention"), sort_keys=True), r["config"].get("seed"))
        if key in seen:
            raise DataError(
                f"runs {seen[key]} and {r['name']} are the same model with the same seed "
                f"({r['config'].get('seed')}); keep one"
            )
        seen[key] = r["name"]


# ----------------------------------------------------------------------------------------------- inputs
def collect_records(
    paths: Sequence[Path], load_corpus: Callable[[dict], object], settings: StudySettings, progress: bool = True
) -> tuple[list[dict], list[str]]:
    """Every input as a record (run directories evaluated now), and notes on what was left out."""
    from tqdm import tqdm

    run_dirs, record_files, skipped = find_inputs(paths)
    records = [read_record(p) for p in record_files]
    corpora: dict[str, object] = {}
    for run in tqdm(run_dirs, desc="evaluating runs", unit="run", disable=not progress):
        info = read_run_dir(run)
        key = json.dumps(info.config["data"], sort_keys=True)
        if key not in corpora:
            corpora[key] = load_corpus(info.config)
        corpus = corpora[key]
        if settings.split not in corpus.splits:
            available = ", ".join(corpus.splits)
            raise ConfigError(
                f"split {settings.split!r} is not a split of corpus {corpus.name}; available: {available}"
            )
        if not corpus.splits[settings.split]:
            raise DataError(f"split {settings.split!r} of corpus {corpus.name} has no sentence pairs to evaluate on")
        records.append(record_of(run, info, corpus, settings))
    for r in records:
        if r["split"] != settings.split:
            raise DataError(
                f"record {r['name']} holds split {r['split']!r}, not {settings.split!r}; pass --split {r['split']}"
            )
    notes = [f"`{p.name}` has no checkpoints/best.pt yet and was left out." for p in skipped]
    return records, notes


def record_of(run: Path, info, corpus, settings: StudySettings) -> dict:
    """The run's record: the one cached in the run directory (RECORD) when it is newer than best.pt and was
    made for the same split and decoding, else a new one (then cached there)."""
    cached = run / RECORD
    if cached.is_file() and cached.stat().st_mtime >= (run / "checkpoints" / "best.pt").stat().st_mtime:
        try:
            record = read_record(cached)
        except DataError:
            record = None
        wanted = {k: v for k, v in settings.record.decoding.items()}
        if (
            record is not None
            and record["split"] == settings.split
            and all(record["decoding"].get(k) == v for k, v in wanted.items())
        ):
            return record
    record = make_record(info, corpus, settings.split, settings.record)
    write_record(record, cached)
    return record


def default_output(paths: Sequence[Path]) -> Path:
    """A sweep directory given alone; the folder above a directory of records; else the inputs' common parent."""
    if len(paths) == 1 and Path(paths[0]).is_dir() and not (Path(paths[0]) / "checkpoints").is_dir():
        p = Path(paths[0])
        return p.parent if p.name == "records" else p
    return Path(os.path.commonpath([str(Path(p).resolve().parent) for p in paths]))


# -------------------------------------------------------------------------------------------- summary
def group_runs(runs: Sequence[StudyRun]) -> list[tuple[str, list[StudyRun]]]:
    """Runs of one model (config without the seed) together, the fixed-vector baseline first, each group's
    runs by seed; keyed by the attention's name (its decoder label where two groups share a name)."""
    groups: dict[str, list[StudyRun]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in flatten(run.config).items() if k.startswith("attention.")}, sort_keys=True)
        groups.setdefault(key, []).append(run)
    members = sorted(
        groups.values(), key=lambda g: (g[0].attention != BASELINE, g[0].attention, decoder_label(g[0].config))
    )
    names = [g[0].attention for g in members]
    return [
        (
            g[0].attention if names.count(g[0].attention) == 1 else decoder_label(g[0].config),
            sorted(g, key=lambda r: str(r.seed)),
        )
        for g in members
    ]


def choose_edges(words: Sequence[int], min_bucket: int) -> tuple[list[int], bool]:
    """(the finest candidate whose every bucket holds >= min_bucket items, True); when none does, (the one
    whose smallest bucket is largest, False)."""

    def smallest(edges: Sequence[int]) -> int:
        counts = [0] * len(edges)
        for n in words:
            counts[bucket_of(n, edges)] += 1
        return min(counts)

    for edges in CANDIDATE_EDGES:
        if smallest(edges) >= min_bucket:
            return list(edges), True
    return list(max(CANDIDATE_EDGES, key=smallest)), False


def _unit_index(record: dict, n: int) -> list[int]:
    units = record.get("units") or list(range(n))
    index = {u: i for i, u in enumerate(dict.fromkeys(units))}
    return [index[u] for u in units]


def _mean(values: Sequence[float], digits: int = 2) -> float:
    return round(float(np.mean(values)), digits)


def summarise(runs: Sequence[StudyRun], settings: StudySettings, notes: list[str]) -> dict:
    """study.json's dict, computed from the runs' records alone."""
    groups = group_runs(runs)
    first = runs[0].record
    sets = sorted(first["sets"].items(), key=lambda kv: kv[1]["k"])
    windowed = len(sets) > 1
    trained_k = int(first["config"].get("data", {}).get("window") or 1)
    n_base = len(sets[0][1]["references"])
    units = _unit_index(first, n_base)
    draws = Draws.of(max(units) + 1, settings.bootstrap, settings.seed)
    weights = {name: draws.weights(units, s["sizes"]) for name, s in sets}
    baseline = next((g for key, g in groups if g[0].attention == BASELINE), None)

    models, paired, inter = {}, {}, {}
    for key, members in groups:
        S = len(members)
        resample = seed_draws(S, settings.bootstrap, settings.seed + 1) if S > 1 else None
        by_k = []
        for name, s in sets:
            outs = [r.outputs[name] for r in members]
            by_k.append(
                {
                    "k": s["k"],
                    "set": name,
                    "n": len(s["references"]),
                    "source_words": round(float(np.mean(s["source_words"])), 1),
                    "trained": s["k"] <= trained_k,
                    **seed_cell(outs, weights[name], resample),
                }
            )
        m = {
            "label": decoder_label(members[0].config),
            "attention": members[0].attention,
            "query": members[0].config.get("attention", {}).get("query"),
            "input_feeding": members[0].config.get("model", {}).get("input_feeding"),
            "seeds": S,
            "seed_list": [r.seed for r in members],
            "runs": [r.name for r in members],
            "parameters": members[0].record["parameters"],
            "steps": _mean([r.record["steps"] for r in members], 0),
            "epochs": _mean([r.record["epochs"] for r in members], 1),
            "train_minutes": _mean([r.record["train_minutes"] for r in members], 1),
            "chrf": _mean([r.record["sets"][sets[0][0]]["chrf"] for r in members]),
            "bleu_by_k": {str(row["k"]): row["bleu"] for row in by_k},
            "by_k": by_k,
        }
        k_top = min(trained_k, sets[-1][1]["k"])
        if windowed and k_top > 1 and not all(r.outputs[sets[0][0]].bleu() > 0 for r in members):
            notes.append(f"{key} has BLEU 0 at k=1 for a seed: no ratio BLEU(k={k_top}) / BLEU(k=1), no interaction.")
        elif windowed and k_top > 1:
            top = next(name for name, s in sets if s["k"] == k_top)
            per_seed = [r.outputs[top].bleu() / r.outputs[sets[0][0]].bleu() for r in members]
            m["ratio_k"] = k_top
            m["ratio"] = round(float(np.mean(per_seed)), 3)
            m["ratio_seeds"] = [round(x, 3) for x in per_seed]
        models[key] = m
        if baseline is None or members is baseline:
            continue
        base_by_seed = {str(r.seed): r for r in baseline}
        shared = [(r, base_by_seed[str(r.seed)]) for r in members if str(r.seed) in base_by_seed]
        if not shared:
            notes.append(f"{key} shares no seed with {BASELINE}: not tested (seeds are paired by their recorded seed).")
            continue
        paired[key] = {
            str(s["k"]): {
                "set": name,
                **paired_cell([(a.outputs[name], b.outputs[name]) for a, b in shared], weights[name]),
            }
            for name, s in sets
        }
        if "ratio" in m and all(b.outputs[sets[0][0]].bleu() > 0 for _, b in shared):
            top = next(name for name, s in sets if s["k"] == m["ratio_k"])
            pairs = [
                ((a.outputs[sets[0][0]], a.outputs[top]), (b.outputs[sets[0][0]], b.outputs[top])) for a, b in shared
            ]
            resample = seed_draws(len(shared), settings.bootstrap, settings.seed + 2) if len(shared) > 1 else None
            inter[key] = {
                **interaction(
                    [p[0] for p in pairs], [p[1] for p in pairs], (weights[sets[0][0]], weights[top]), resample
                ),
                "k": m["ratio_k"],
                "resampled": "units and seeds" if len(shared) > 1 else "units only (one seed: no seed variance)",
            }
    add_holm([cell for cells in paired.values() for cell in cells.values()])
    by_length = length_rows(runs, groups, sets, settings, notes)
    if any(len(g) == 1 for _, g in groups):
        notes.append("One seed for some models: their intervals and tests have no seed variance.")
    notes += [
        f"`{r.name}` had not finished training (no metrics.json) when it was recorded."
        for r in runs
        if not r.record["finished"]
    ]
    beyond = [s["k"] for _, s in sets if s["k"] > trained_k]
    if windowed and beyond:
        notes.append(
            f"k = {', '.join(map(str, beyond))}: longer than any training example (at most {trained_k} joined); "
            "these columns measure length generalisation and are kept apart from the trained range."
        )
    ov = first["overlap"]
    return {
        "corpus": first["corpus"],
        "split": first["split"],
        "sets": [
            {
                "k": s["k"],
                "set": name,
                "n": len(s["references"]),
                "source_words": round(float(np.mean(s["source_words"])), 1),
                "trained": s["k"] <= trained_k,
            }
            for name, s in sets
        ],
        "trained_k": trained_k,
        "decoding": {k: v for k, v in first["decoding"].items() if k not in DECODING_MAY_DIFFER},
        "signatures": first.get("signatures"),
        "bootstrap": settings.bootstrap,
        "resampling": {
            "seed": settings.seed,
            "samples": settings.bootstrap,
            "unit": "chapter" if first.get("units") else "pair (caption)",
            "units": max(units) + 1,
            "test": "paired bootstrap (sacrebleu's two-sided rule), one test per seed pair on the same draws; "
            "a cell combines its seed pairs by their largest p and is significant only when every seed pair's "
            "difference has the same sign; Holm's correction over every k and model tested",
        },
        "overlap": ov,
        "models": models,
        "paired": paired,
        "interaction": inter,
        "by_length": by_length,
        "runs": [run_row(r) for _, g in groups for r in g],
        "long": {key: g[0].record["long"] for key, g in groups},
        "notes": notes,
    }


def length_rows(runs, groups, sets, settings: StudySettings, notes: list[str]) -> dict:
    """BLEU by source length over every evaluated item (all k pooled), per model: seed mean, 95% interval
    (items and seeds resampled), and paired tests against the baseline (Holm over buckets and models)."""
    pooled = [(name, i) for name, s in sets for i in range(len(s["references"]))]
    words = [runs[0].record["sets"][name]["source_words"][i] for name, i in pooled]
    if settings.edges is not None:
        edges = check_edges(settings.edges, "--buckets")
    else:
        edges, ok = choose_edges(words, settings.min_bucket)
        if not ok:
            notes.append(f"No candidate bucket edges give {settings.min_bucket} items in every bucket; using {edges}.")
    members: list[list[int]] = [[] for _ in edges]
    for j, n in enumerate(words):
        members[bucket_of(n, edges)].append(j)
    rows: dict[str, list[dict]] = {}
    tests: dict[str, list] = {}
    baseline = next((g for _, g in groups if g[0].attention == BASELINE), None)

    def stacked(run: StudyRun, idx: list[int]) -> Output:
        """The run's outputs of the pooled items `idx`, as one Output."""
        picks = [(run.outputs[pooled[j][0]], pooled[j][1]) for j in idx]
        return Output(
            [o.hypotheses[i] for o, i in picks],
            [o.references[i] for o, i in picks],
            [words[j] for j in idx],
            np.stack([o.stats[i] for o, i in picks]) if picks else np.zeros((0, 10)),
        )

    for b, idx in enumerate(members):
        w = Draws.of(len(idx), settings.bootstrap, settings.seed + 3 + b).counts if idx else None
        for key, g in groups:
            resample = seed_draws(len(g), settings.bootstrap, settings.seed + 1) if len(g) > 1 else None
            row = {"bucket": bucket_labels(edges)[b], "lo": edges[b], "n": len(idx)}
            row.update(seed_cell([stacked(r, idx) for r in g], w, resample) if idx else {"bleu": None})
            rows.setdefault(key, []).append(row)
            if baseline is not None and g is not baseline and idx:
                base = {str(r.seed): r for r in baseline}
                pairs = [(stacked(r, idx), stacked(base[str(r.seed)], idx)) for r in g if str(r.seed) in base]
                if pairs:
                    tests.setdefault(key, []).append({"bucket": row["bucket"], **paired_cell(pairs, w)})
    add_holm([c for cells in tests.values() for c in cells])
    return {
        "edges": edges,
        "labels": bucket_labels(edges),
        "counts": [len(m) for m in members],
        "rows": rows,
        "tests": tests,
    }


def run_row(run: StudyRun) -> dict:
    r = run.record
    made = r.get("provenance") or {}
    return {
        "name": run.name,
        "attention": run.attention,
        "seed": run.seed,
        "bleu_by_k": {str(s["k"]): s["bleu"] for s in sorted(r["sets"].values(), key=lambda s: s["k"])},
        "train_minutes": r["train_minutes"],
        "trained_at": r.get("trained_at"),
        "steps": r["steps"],
        "epochs": r["epochs"],
        "best": r["best"],
        "finished": r["finished"],
        "cpu": made.get("cpu_model") or f"{r['recorded_by'].get('cpu_model')} (recorded there; training's not stored)",
        "torch": made.get("torch") or r["recorded_by"].get("torch"),
        "commit": made.get("commit"),
        "precision": r["decoding"].get("precision"),
        "learning_curve": r["learning_curve"],
    }


# ---------------------------------------------------------------------------------------------- study
def run_study(
    paths: Sequence[Path],
    load_corpus: Callable[[dict], object],
    out_dir: Path | None = None,
    settings: StudySettings | None = None,
    progress: bool = True,
) -> dict:
    """Record every run under `paths` (or read its record), check, compare, write the study; returns
    study.json's dict."""
    s = settings or StudySettings()
    check_split(s.split)
    if s.bootstrap < MIN_SAMPLES:
        raise ConfigError(
            f"--bootstrap {s.bootstrap}: use at least {MIN_SAMPLES} resamples (p-values below 1/(B+1) cannot be "
            "told apart, and intervals from fewer resamples wobble)"
        )
    records, notes = collect_records(paths, load_corpus, s, progress)
    check_records(records)
    out = Path(out_dir) if out_dir is not None else default_output(paths)
    written = [write_record(r, out / "records" / f"{r['name']}.json.gz") for r in records]
    # computed from the records as written (their key order and values), so a rebuild from them is equal
    runs = sorted((StudyRun.of(read_record(p)) for p in written), key=lambda r: r.name)
    summary = summarise(runs, s, notes)
    write_study(summary, out)
    return summary
