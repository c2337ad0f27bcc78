"""The bottleneck study: records of runs that differ only in the attention, compared by window size k (the
same test content joined k at a time) and by source length, with seeds, paired tests and the interaction.

    settings = StudySettings(split="test", bootstrap=1000)
    summary = run_study([Path("multirun/2024-05-01/12-00-00")], load_corpus, Path("docs/study/x"), settings)

Inputs are run directories (each evaluated into a record: nmt.study.records, greedy and beam 5 by default)
or records made before, in any mix; everything after that is computed from records alone
(nmt.study.summary), so a study rebuilt from its records equals the one built from the run directories,
file for file. The output directory gets records/<run>.json.gz, study.json, study.md and the figures
(nmt.study.report). `load_corpus(config)` rebuilds a run's corpus from its stored config; the command
supplies it, so this module needs no config library. What is refused: nmt.study.checks.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nmt.errors import ConfigError, DataError
from nmt.metrics import check_edges
from nmt.study.checks import check_records, check_split
from nmt.study.records import RecordSettings, StudyRun, make_record, read_record, record_decodings, write_record
from nmt.study.report import write_study
from nmt.study.runs import find_inputs, read_run_dir
from nmt.study.stats import MIN_SAMPLES, SEED
from nmt.study.summary import summarise

log = logging.getLogger(__name__)
RECORD = "study_record.json.gz"  # a run directory's cached record (nmt-study writes it; best.pt newer: made anew)


@dataclass
class StudySettings:
    split: str = "test"
    edges: list[int] | None = None  # None: chosen from nmt.study.lengths.CANDIDATE_EDGES
    min_bucket: int = 80  # items every bucket needs when the edges are chosen automatically
    bootstrap: int = MIN_SAMPLES  # resamples for intervals and tests
    seed: int = SEED  # the resampling seed
    record: RecordSettings = field(default_factory=RecordSettings)


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
    made for the same split with every beam size asked for, else a new one (then cached there)."""
    cached = run / RECORD
    if cached.is_file() and cached.stat().st_mtime >= (run / "checkpoints" / "best.pt").stat().st_mtime:
        try:
            record = read_record(cached)
        except DataError:
            record = None
        if record is not None and record["split"] == settings.split:
            beams = {int(d.get("beam_size", 1)) for d in record_decodings(record).values()}
            if set(settings.record.beams) <= beams:
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
    if s.edges is not None:
        check_edges(s.edges, "--buckets")
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
