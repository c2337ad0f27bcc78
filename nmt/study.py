"""The bottleneck study: runs that differ in the attention, compared by BLEU per source-length bucket.

    settings = StudySettings(splits=["test"], bootstrap=1000)
    summary = run_study([Path("multirun/2024-05-01/12-00-00")], load_corpus, settings=settings)
    print(table_markdown(summary))          # nmt.study_report

`nmt-study` (nmt.cli.study) is the command. Given a sweep directory (its subdirectories holding
checkpoints/best.pt are the runs) or run directories, each run's best checkpoint is evaluated with
nmt.evaluation on the chosen split(s), concatenated (its files go to <run>/eval/ as nmt-evaluate writes
them). Every bucket's BLEU gets a 95% bootstrap interval; runs whose configs differ only in the seed are
one group (mean over seeds, interval = the envelope of the seeds' intervals). The output directory gets
study.md, study.json (the numbers behind every figure; for the heatmaps, the pieces and each output
piece's most attended source piece), bleu_by_length.png, learning_curves.png (from the checkpoints'
validation history) and attention_long_sentence.png.

Buckets are the given edges, or the first (finest) of CANDIDATE_EDGES whose every bucket holds at least
`min_bucket` evaluated sentences. `load_corpus(config)` rebuilds a run's corpus from its stored resolved
config; the command supplies it, so this module needs no config library.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nmt.corpora import Corpus
from nmt.errors import ConfigError, DataError
from nmt.metrics import bootstrap_bleu, bucket_labels, bucket_of
from nmt.study_report import write_study

if TYPE_CHECKING:
    from nmt.translator import Translation

log = logging.getLogger(__name__)

BEST = Path("checkpoints") / "best.pt"
CANDIDATE_EDGES = ([0, 10, 20, 30, 40, 50], [0, 10, 20, 30, 40], [0, 15, 25, 35, 45], [0, 10, 20, 30],
                   [0, 15, 25, 35], [0, 20, 30])  # finest first
# config keys that do not change what a run learns (prefixes end with ".")
IGNORED_KEYS = ("device", "paths.", "trainer.progress", "trainer.resume", "trainer.threads",
                "trainer.log_every", "trainer.heatmaps")
Pair = tuple[str, str]


@dataclass
class StudySettings:
    splits: list[str] = field(default_factory=lambda: ["test"])  # evaluated together, concatenated
    edges: list[int] | None = None  # None: chosen from CANDIDATE_EDGES
    min_bucket: int = 80  # sentences every bucket needs when the edges are chosen automatically
    bootstrap: int = 1000  # resamples per bucket (0: no intervals)
    heatmaps: int = 4  # per-run heatmaps in <run>/eval/attention/
    long_words: int = 40  # the side-by-side heatmaps show the longest source with at most this many words
    device: str = "cpu"
    decoding: dict = field(default_factory=dict)  # Translator keywords, e.g. {"beam_size": 5}


@dataclass
class Run:
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
            raise DataError(f"{p}: no such directory; pass a sweep directory (multirun/<date>/<time>) "
                            "or run directories")
        if (p / BEST).is_file():
            runs.append(p)
            continue
        subdirs = sorted((d for d in p.iterdir() if d.is_dir() and d.name[0] != "."), key=_job_order)
        found = [d for d in subdirs if (d / BEST).is_file()]
        if not found:
            raise DataError(f"{p}: no runs (no checkpoints/best.pt in it or its subdirectories); pass the "
                            "directory of an nmt-train multirun, or wait for the first validation")
        runs += found
        skipped += [d for d in subdirs if (d / ".hydra").is_dir() and d not in found]
    return list(dict.fromkeys(runs)), skipped


def load_run(path: Path) -> Run:
    """A run's config, history and progress (from last.pt when present: the whole training so far)."""
    from nmt.checkpoint import load_checkpoint

    last = path / "checkpoints" / "last.pt"
    payload = load_checkpoint(last if last.is_file() else path / BEST)
    if not isinstance(payload.get("config"), dict) or not payload["config"].get("data"):
        raise DataError(f"{path}: its checkpoint stores no training config; evaluate it with nmt-evaluate "
                        "and data=...")
    done = {"step": payload.get("step", 0), "epoch": payload.get("epoch", 0),
            "train_minutes": round(float(payload.get("elapsed", 0.0)) / 60, 2)}
    metrics = path / "metrics.json"  # the finished run's own summary (its epoch count includes the last)
    if metrics.is_file():
        try:
            done.update({k: v for k, v in json.loads(metrics.read_text()).items() if k in done})
        except (OSError, ValueError):
            log.warning("%s: unreadable; using the checkpoint's step and epoch", metrics)
    return Run(path, payload["config"], list(payload.get("history", [])), int(done["step"]),
               int(done["epoch"]), float(done["train_minutes"]), metrics.is_file())


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
    return [k for k in keys if not _ignored(k) and not skip(k)
            and len({json.dumps(f.get(k, "<unset>"), sort_keys=True) for f in flat}) > 1]


def group_runs(runs: Sequence[Run]) -> list[tuple[str, list[Run]]]:
    """Runs whose configs differ only in the seed (and ignored keys), labelled by attention, in run order."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        flat = flatten(run.config)
        key = json.dumps({k: v for k, v in flat.items() if k != "seed" and not _ignored(k)}, sort_keys=True)
        groups.setdefault(key, []).append(run)
    labelled = []
    for members in groups.values():
        same = [g for g in groups.values() if g[0].attention == members[0].attention]
        label = members[0].attention
        if len(same) > 1:  # the same attention twice: name what sets this group apart
            keys = differing_keys([g[0].config for g in same], lambda k: k == "seed")
            flat = flatten(members[0].config)
            label += " (" + ", ".join(f"{k}={flat.get(k)}" for k in keys) + ")"
        labelled.append((label, members))
    return labelled


# ---------------------------------------------------------------------------------------------- buckets
def check_edges(edges: Sequence[int]) -> list[int]:
    edges = list(edges)
    increasing = bool(edges) and all(isinstance(e, int) for e in edges) and sorted(set(edges)) == edges
    if not increasing or edges[0] != 0:
        raise ConfigError("bucket edges must be strictly increasing word counts starting at 0, "
                          f"e.g. 0,15,25,35; not {','.join(map(str, edges))}")
    return edges


def bucket_counts(word_counts: Sequence[int], edges: Sequence[int]) -> list[int]:
    counts = [0] * len(edges)
    for n in word_counts:
        counts[bucket_of(n, edges)] += 1
    return counts


def choose_edges(word_counts: Sequence[int], min_bucket: int,
                 candidates: Sequence[Sequence[int]] = CANDIDATE_EDGES) -> tuple[list[int], bool]:
    """(the first candidate whose every bucket holds >= min_bucket sentences, True); when none does,
    (the candidate whose smallest bucket is largest, False)."""
    for edges in candidates:
        if min(bucket_counts(word_counts, edges)) >= min_bucket:
            return list(edges), True
    return list(max(candidates, key=lambda e: min(bucket_counts(word_counts, e)))), False


def add_intervals(rows: list[dict], pairs: Sequence[Pair], hypotheses: Sequence[str], edges: Sequence[int],
                  samples: int) -> None:
    """Give every by-length row a 95% bootstrap interval ("low", "high"; None when empty or samples = 0).

    The same resampling seed for every run makes the intervals of runs on the same sentences paired.
    """
    members: list[list[int]] = [[] for _ in edges]
    for i, (src, _) in enumerate(pairs):
        members[bucket_of(len(src.split()), edges)].append(i)
    for row, idx in zip(rows, members, strict=True):
        row["low"] = row["high"] = None
        if idx and samples > 0:
            hyps, refs = [hypotheses[i] for i in idx], [pairs[i][1] for i in idx]
            _, row["low"], row["high"] = bootstrap_bleu(hyps, refs, samples)


def long_sentence(pairs: Sequence[Pair], max_words: int) -> int:
    """Index of the longest source with at most `max_words` words (else the shortest longer one)."""
    def rank(i: int) -> tuple[bool, int, int]:
        n = len(pairs[i][0].split())
        return (n <= max_words, n if n <= max_words else -n, -i)

    return max(range(len(pairs)), key=rank)


def alignment(run: Run) -> dict | None:
    """The long sentence's heatmap in brief: the pieces and, per output piece, the most attended source
    piece (None without alignment)."""
    t = run.long
    if not run.has_alignment or t is None:
        return None
    return {"src_pieces": t.src_pieces, "tgt_pieces": t.tgt_pieces,
            "argmax": [int(i) for i in t.attention[: len(t.tgt_pieces)].argmax(dim=1).tolist()]}


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


# ------------------------------------------------------------------------------------------- evaluation
def evaluate_run(run: Run, corpus: Corpus, pairs: Sequence[Pair], split: str, edges: list[int],
                 settings: StudySettings, long_source: str) -> None:
    """Evaluate the run's best checkpoint (files into <run>/eval/) and fill run.result, .parameters, .long."""
    from nmt.checkpoint import load_checkpoint
    from nmt.evaluation import evaluate
    from nmt.translator import Translator

    path = run.path / BEST
    payload = load_checkpoint(path)
    translator = Translator.from_payload(payload, settings.device, checkpoint=str(path), **settings.decoding)
    meta = {"corpus": corpus.name, "src_lang": corpus.src_lang, "tgt_lang": corpus.tgt_lang,
            "step": payload.get("step")}
    result = evaluate(translator, pairs, edges, settings.heatmaps, run.path / "eval", split, meta)
    hypotheses = result.pop("hypotheses")
    add_intervals(result["by_length"], pairs, hypotheses, edges, settings.bootstrap)
    run.result, run.parameters = result, translator.model.num_parameters()
    run.has_alignment = translator.has_alignment
    run.long = translator.translate([long_source])[0][0]


def _mean(values: Sequence[float | None], digits: int = 2) -> float | None:
    return None if not values or any(v is None for v in values) else round(sum(values) / len(values), digits)


def summarise(label: str, runs: Sequence[Run]) -> dict:
    """One group's numbers: means over its seeds; a bucket's interval spans all its seeds' intervals."""
    rows = []
    for k, row in enumerate(runs[0].result["by_length"]):
        per = [r.result["by_length"][k] for r in runs]
        lows, highs = [p["low"] for p in per], [p["high"] for p in per]
        rows.append({**{key: row[key] for key in ("bucket", "lo", "hi", "n")},
                     "bleu": _mean([p["bleu"] for p in per]), "chrf": _mean([p["chrf"] for p in per]),
                     "low": None if None in lows else min(lows),
                     "high": None if None in highs else max(highs),
                     "seed_bleu": [p["bleu"] for p in per]})
    return {"label": label, "attention": runs[0].attention, "seeds": [r.config.get("seed") for r in runs],
            "runs": [str(r.path) for r in runs], "sentences": runs[0].result["sentences"],
            **{m: _mean([r.result[m] for r in runs]) for m in ("bleu", "chrf", "ter")},
            "parameters": runs[0].parameters, "steps": round(sum(r.step for r in runs) / len(runs)),
            "epochs": _mean([r.epoch for r in runs], 1), "train_minutes": _mean([r.minutes for r in runs]),
            "by_length": rows}


def run_summary(run: Run) -> dict:
    r = run.result
    return {"path": str(run.path), "attention": run.attention, "seed": run.config.get("seed"),
            **{m: r[m] for m in ("sentences", "bleu", "chrf", "ter", "by_length", "files")},
            "step": run.step, "epoch": run.epoch, "train_minutes": run.minutes, "finished": run.finished,
            "best_step": r.get("step"), "parameters": run.parameters,
            "learning_curve": learning_curve(run.history)}


def config_notes(groups: Sequence[tuple[str, list[Run]]]) -> tuple[dict, list[str]]:
    """({key: {group label: value}} for keys other than the attention's that differ, notes saying so)."""
    keys = differing_keys([members[0].config for _, members in groups],
                          lambda k: k.startswith("attention.") or k == "seed")
    diff = {k: {label: flatten(members[0].config).get(k) for label, members in groups} for k in keys}
    seeds = {label: sorted({r.config.get("seed") for r in members}) for label, members in groups}
    notes = []
    if diff:
        listed = "; ".join(f"`{k}` (" + ", ".join(f"{lab}: {v}" for lab, v in vals.items()) + ")"
                           for k, vals in diff.items())
        notes.append(f"The runs differ in more than the attention, so compare with care: {listed}.")
    else:
        notes.append("The runs differ only in the attention" + (" and the seed." if any(
            len(v) > 1 for v in seeds.values()) else "."))
    if len({json.dumps(v) for v in seeds.values()}) > 1:
        listed = "; ".join(f"{k}: {v}" for k, v in seeds.items())
        notes.append(f"Seeds differ between attention types: {listed}.")
    return diff, notes


def default_output(paths: Sequence[Path], runs: Sequence[Path]) -> Path:
    """The sweep directory when one was given, else the run directories' common parent."""
    if len(paths) == 1 and not (Path(paths[0]) / BEST).is_file():
        return Path(paths[0])
    return Path(os.path.commonpath([str(p.resolve().parent) for p in runs]))


def run_study(paths: Sequence[Path], load_corpus: Callable[[dict], Corpus], out_dir: Path | None = None,
              settings: StudySettings | None = None, progress: bool = True) -> dict:
    """Evaluate every run under `paths`, group, compare, write the study files; returns study.json's dict."""
    from tqdm import tqdm

    s = settings or StudySettings()
    run_dirs, skipped = find_runs(paths)
    runs = [load_run(p) for p in run_dirs]
    split = "+".join(s.splits)
    corpora: dict[str, tuple[Corpus, list[Pair]]] = {}
    for run in runs:
        key = json.dumps(run.config["data"], sort_keys=True)
        if key not in corpora:
            corpus = load_corpus(run.config)
            missing = [x for x in s.splits if x not in corpus.splits]
            if missing:
                raise ConfigError(f"split {missing[0]!r} is not a split of corpus {corpus.name}; "
                                  f"available: {', '.join(corpus.splits)}")
            corpora[key] = corpus, [p for x in s.splits for p in corpus.splits[x]]
    sets = [corpora[json.dumps(r.config["data"], sort_keys=True)] for r in runs]
    pairs = sets[0][1]
    if not pairs:
        raise DataError(f"split {split!r} of corpus {sets[0][0].name} has no sentence pairs to evaluate on")
    words = [len(src.split()) for src, _ in pairs]
    if s.edges is not None:
        edges, notes = check_edges(s.edges), [f"Buckets as given: edges {check_edges(s.edges)}."]
    else:
        edges, ok = choose_edges(words, s.min_bucket)
        notes = [f"Buckets chosen automatically: the finest candidate edge set with at least {s.min_bucket} "
                 "sentences in every bucket." if ok else
                 f"No candidate edge set has {s.min_bucket} sentences in every bucket; using the one whose "
                 f"smallest bucket is largest ({min(bucket_counts(words, edges))} sentences)."]
    if len(corpora) > 1:
        notes.append("The runs were trained on different corpora, so they were evaluated on different "
                     "sentences; buckets were chosen on the first run's.")
    li = long_sentence(pairs, s.long_words)
    for run, (corpus, run_pairs) in tqdm(list(zip(runs, sets, strict=True)), desc="runs", unit="run",
                                         disable=not progress):
        evaluate_run(run, corpus, run_pairs, split, edges, s, pairs[li][0])
    groups = group_runs(runs)
    diff, config_lines = config_notes(groups)
    notes += config_lines
    notes += [f"`{r.path}` has no metrics.json (still training, or stopped): its best checkpoint so far "
              f"was evaluated, after {r.step} steps." for r in runs if not r.finished]
    notes += [f"`{p}` has no checkpoints/best.pt yet and was left out." for p in skipped]
    decoding = {k: v for k, v in runs[0].result["decoding"].items() if k != "attention"}
    summary = {
        "split": split, "sentences": len(pairs), "corpus": sets[0][0].name, "decoding": decoding,
        "buckets": {"edges": edges, "labels": bucket_labels(edges), "given": s.edges is not None,
                    "min_bucket": s.min_bucket, "counts": bucket_counts(words, edges)},
        "bootstrap": s.bootstrap, "groups": [summarise(label, members) for label, members in groups],
        "runs": [run_summary(r) for r in runs], "config_differences": diff, "notes": notes,
        "long_sentence": {"sentence": li + 1, "words": words[li], "source": pairs[li][0],
                          "reference": pairs[li][1],
                          "outputs": {label: members[0].long.text for label, members in groups},
                          "alignments": {label: alignment(members[0]) for label, members in groups}},
        "files": {},
    }
    write_study(summary, groups, out_dir or default_output(paths, run_dirs))
    return summary
