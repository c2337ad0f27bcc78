"""The bottleneck study: runs that differ in the attention, compared by BLEU per source-length bucket
(and per verse-window size, where the corpus has test_k<k> sets), with seeds and paired tests.

    settings = StudySettings(splits=["test"], bootstrap=1000)
    summary = run_study([Path("multirun/2024-05-01/12-00-00")], load_corpus, settings=settings)
    print(table_markdown(summary))          # nmt.study_report

`nmt-study` (nmt.cli.study) is the command. Given a sweep directory (its subdirectories holding
checkpoints/best.pt are the runs) or run directories, each run's best checkpoint is evaluated with
nmt.evaluation on the chosen split(s), concatenated (its files go to <run>/eval/ as nmt-evaluate writes
them). "valid" (and valid_k<k>) is refused: it chose each run's best.pt. Runs whose configs differ only in
the seed are one group, labelled by the decoder they really are (decoder_label). With --split test on a
corpus that has test_k1..test_kK (verse windows: the same verses joined k at a time), every test_k<k> set
is evaluated too. The statistics (nmt.study_stats): per cell (bucket, window size, whole split) the seeds'
mean BLEU with a 95% seeds x sentences bootstrap interval, and sacrebleu's paired bootstrap test of each
group against the `none` group, one test per seed pair. The output directory gets study.md, study.json
(the numbers behind every figure; for the heatmaps, the pieces and each output piece's most attended
source piece), bleu_by_length.png, bleu_by_window.png (with windows), learning_curves.png (from the
checkpoints' validation history) and attention_long_sentence.png.

Buckets are the given edges, or the first (finest) of CANDIDATE_EDGES whose every bucket holds at least
`min_bucket` evaluated sentences. `load_corpus(config)` rebuilds a run's corpus from its stored resolved
config; the command supplies it, so this module needs no config library.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nmt.corpora import Corpus
from nmt.errors import ConfigError, DataError
from nmt.metrics import bootstrap_bleu, bucket_labels, bucket_of, check_edges
from nmt.study_report import write_study
from nmt.study_runs import BEST, Run, config_notes, find_runs, group_runs, learning_curve, load_run
from nmt.study_stats import Output, add_tests, summarise

log = logging.getLogger(__name__)
CANDIDATE_EDGES = (
    [0, 10, 20, 30, 40, 50],
    [0, 10, 20, 30, 40],
    [0, 15, 25, 35, 45],
    [0, 10, 20, 30],
    [0, 15, 25, 35],
    [0, 20, 30],
)  # finest first
Pair = tuple[str, str]
SELECTION = re.compile(r"valid(_k\d+)?")  # the splits training validated on (best.pt, early stopping)


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


# ---------------------------------------------------------------------------------------------- buckets
def check_splits(splits: Sequence[str]) -> list[str]:
    """The splits to study; refuses the ones that chose each run's best.pt (valid, valid_k<k>)."""
    chosen = [x for x in splits if SELECTION.fullmatch(x)]
    if chosen:
        which = "valid" if chosen[0] == "valid" else f"{chosen[0]} holds valid's verses, and valid"
        raise ConfigError(
            f"--split {'+'.join(splits)}: {which} chose each run's best.pt (and timed its early "
            "stopping and learning-rate cuts), so a study on it favours every run by its luckiest "
            "checkpoint and its intervals and tests come out too good; use --split test"
        )
    return list(splits)


def window_splits(corpus: Corpus) -> list[str]:
    """["test_k1", ..., "test_kK"]: the corpus's verse-window test sets, K as far as they run unbroken
    (empty when it has none)."""
    out: list[str] = []
    while f"test_k{len(out) + 1}" in corpus.splits:
        out.append(f"test_k{len(out) + 1}")
    return out


def bucket_counts(word_counts: Sequence[int], edges: Sequence[int]) -> list[int]:
    counts = [0] * len(edges)
    for n in word_counts:
        counts[bucket_of(n, edges)] += 1
    return counts


def choose_edges(
    word_counts: Sequence[int], min_bucket: int, candidates: Sequence[Sequence[int]] = CANDIDATE_EDGES
) -> tuple[list[int], bool]:
    """(the first candidate whose every bucket holds >= min_bucket sentences, True); when none does,
    (the candidate whose smallest bucket is largest, False)."""
    for edges in candidates:
        if min(bucket_counts(word_counts, edges)) >= min_bucket:
            return list(edges), True
    return list(max(candidates, key=lambda e: min(bucket_counts(word_counts, e)))), False


def add_intervals(
    rows: list[dict], pairs: Sequence[Pair], hypotheses: Sequence[str], edges: Sequence[int], samples: int
) -> None:
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
    return {
        "src_pieces": t.src_pieces,
        "tgt_pieces": t.tgt_pieces,
        "argmax": [int(i) for i in t.attention[: len(t.tgt_pieces)].argmax(dim=1).tolist()],
    }


# ------------------------------------------------------------------------------------------- evaluation
def evaluate_run(
    run: Run, corpus: Corpus, sets: dict[str, list[Pair]], edges: list[int], settings: StudySettings, long_source: str
) -> None:
    """Evaluate the run's best checkpoint on every set (files into <run>/eval/); the first set is the study's
    split (by-length rows and heatmaps), the others the verse-window sets test_k<k>. Fills run.result,
    .outputs, .windows, .parameters, .long."""
    from nmt.checkpoint import load_checkpoint
    from nmt.evaluation import evaluate
    from nmt.translator import Translator

    path = run.path / BEST
    payload = load_checkpoint(path)
    translator = Translator.from_payload(payload, settings.device, checkpoint=str(path), **settings.decoding)
    meta = {
        "corpus": corpus.name,
        "src_lang": corpus.src_lang,
        "tgt_lang": corpus.tgt_lang,
        "step": payload.get("step"),
    }
    (split, pairs), *windows = sets.items()
    result = evaluate(translator, pairs, edges, settings.heatmaps, run.path / "eval", split, meta)
    hypotheses = result.pop("hypotheses")
    add_intervals(result["by_length"], pairs, hypotheses, edges, settings.bootstrap)
    run.outputs[split] = Output.of(hypotheses, [t for _, t in pairs], [s for s, _ in pairs])
    for name, window_pairs in windows:
        if list(map(tuple, window_pairs)) == list(map(tuple, pairs)):  # test_k1 = the single verses: reuse
            run.outputs[name], run.windows[name] = (
                run.outputs[split],
                {k: result[k] for k in ("bleu", "chrf", "sentences", "files")},
            )
            continue
        r = evaluate(translator, window_pairs, edges, 0, run.path / "eval", name, meta)
        run.outputs[name] = Output.of(r.pop("hypotheses"), [t for _, t in window_pairs], [s for s, _ in window_pairs])
        run.windows[name] = {k: r[k] for k in ("bleu", "chrf", "sentences", "files")}
    run.result, run.parameters = result, translator.model.num_parameters()
    run.has_alignment = translator.has_alignment
    run.long = translator.translate([long_source])[0][0]


def run_summary(run: Run) -> dict:
    r = run.result
    return {
        "path": str(run.path),
        "attention": run.attention,
        "seed": run.config.get("seed"),
        **{m: r[m] for m in ("sentences", "bleu", "chrf", "ter", "by_length", "files")},
        "step": run.step,
        "epoch": run.epoch,
        "train_minutes": run.minutes,
        "finished": run.finished,
        "best_step": r.get("step"),
        "parameters": run.parameters,
        "windows": run.windows,
        "learning_curve": learning_curve(run.history),
    }


def default_output(paths: Sequence[Path], runs: Sequence[Path]) -> Path:
    """The sweep directory when one was given, else the run directories' common parent."""
    if len(paths) == 1 and not (Path(paths[0]) / BEST).is_file():
        return Path(paths[0])
    return Path(os.path.commonpath([str(p.resolve().parent) for p in runs]))


def load_sets(
    runs: Sequence[Run], load_corpus: Callable[[dict], Corpus], splits: Sequence[str]
) -> tuple[list[tuple[Corpus, dict[str, list[Pair]]]], list[str]]:
    """Per run, (its corpus, {study split: pairs (the splits concatenated), test_k<k>: pairs, ...}) and the
    window sets every run's corpus has (only when the study's split is "test")."""
    corpora: dict[str, Corpus] = {}
    for run in runs:
        key = json.dumps(run.config["data"], sort_keys=True)
        if key not in corpora:
            corpus = corpora[key] = load_corpus(run.config)
            missing = [x for x in splits if x not in corpus.splits]
            if missing:
                raise ConfigError(
                    f"split {missing[0]!r} is not a split of corpus {corpus.name}; "
                    f"available: {', '.join(corpus.splits)}"
                )
    windows = min((window_splits(c) for c in corpora.values()), key=len) if list(splits) == ["test"] else []
    out = []
    for run in runs:
        corpus = corpora[json.dumps(run.config["data"], sort_keys=True)]
        sets = {"+".join(splits): [p for x in splits for p in corpus.splits[x]]}
        out.append((corpus, {**sets, **{w: corpus.splits[w] for w in windows}}))
    return out, windows


def run_study(
    paths: Sequence[Path],
    load_corpus: Callable[[dict], Corpus],
    out_dir: Path | None = None,
    settings: StudySettings | None = None,
    progress: bool = True,
) -> dict:
    """Evaluate every run under `paths`, group, compare, write the study files; returns study.json's dict."""
    from tqdm import tqdm

    s = settings or StudySettings()
    split = "+".join(check_splits(s.splits))
    run_dirs, skipped = find_runs(paths)
    runs = [load_run(p) for p in run_dirs]
    sets, windows = load_sets(runs, load_corpus, s.splits)
    pairs = sets[0][1][split]
    if not pairs:
        raise DataError(f"split {split!r} of corpus {sets[0][0].name} has no sentence pairs to evaluate on")
    words = [len(src.split()) for src, _ in pairs]
    if s.edges is not None:
        edges = check_edges(s.edges, "--buckets")
        notes = [f"Buckets as given: edges {edges}."]
    else:
        edges, ok = choose_edges(words, s.min_bucket)
        notes = [
            f"Buckets chosen automatically: the finest candidate edge set with at least {s.min_bucket} "
            "sentences in every bucket."
            if ok
            else f"No candidate edge set has {s.min_bucket} sentences in every bucket; using the one whose "
            f"smallest bucket is largest ({min(bucket_counts(words, edges))} sentences)."
        ]
    if len({id(c) for c, _ in sets}) > 1:
        notes.append(
            "The runs were trained on different corpora, so they were evaluated on different "
            "sentences; buckets were chosen on the first run's."
        )
    li = long_sentence(pairs, s.long_words)
    for run, (corpus, run_sets) in tqdm(
        list(zip(runs, sets, strict=True)), desc="runs", unit="run", disable=not progress
    ):
        evaluate_run(run, corpus, run_sets, edges, s, pairs[li][0])
    groups = group_runs(runs)
    diff, config_lines = config_notes(groups)
    notes += config_lines
    notes += [
        f"`{r.path}` has no metrics.json (still training, or stopped): its best checkpoint so far "
        f"was evaluated, after {r.step} steps."
        for r in runs
        if not r.finished
    ]
    notes += [f"`{p}` has no checkpoints/best.pt yet and was left out." for p in skipped]
    summaries = [summarise(label, members, split, edges, windows, s.bootstrap) for label, members in groups]
    tests, test_notes = add_tests(summaries, groups, split, windows, s.bootstrap)
    decoding = {k: v for k, v in runs[0].result["decoding"].items() if k != "attention"}
    first = runs[0].outputs
    summary = {
        "split": split,
        "sentences": len(pairs),
        "corpus": sets[0][0].name,
        "decoding": decoding,
        "buckets": {
            "edges": edges,
            "labels": bucket_labels(edges),
            "given": s.edges is not None,
            "min_bucket": s.min_bucket,
            "counts": bucket_counts(words, edges),
        },
        "windows": {
            "splits": windows,
            "n": [len(first[w].words) for w in windows],
            "source_words": [round(sum(first[w].words) / len(first[w].words), 1) for w in windows],
        }
        if windows
        else None,
        "bootstrap": s.bootstrap,
        "tests": tests,
        "groups": summaries,
        "runs": [run_summary(r) for r in runs],
        "config_differences": diff,
        "notes": notes + test_notes,
        "long_sentence": {
            "sentence": li + 1,
            "words": words[li],
            "source": pairs[li][0],
            "reference": pairs[li][1],
            "outputs": {label: members[0].long.text for label, members in groups},
            "alignments": {label: alignment(members[0]) for label, members in groups},
        },
        "files": {},
    }
    write_study(summary, groups, out_dir or default_output(paths, run_dirs))
    return summary
