"""Train and record a bottleneck study's runs, a few at a time, resuming wherever a previous start stopped.

    python scripts/study_queue.py --records docs/study/converged --runs /tmp/study_runs \\
        --data-root ../shared/data/multi30k --parallel 2 --commit

Jobs are (language pair, attention, seed), ordered seed by seed so that every finished seed pairs all the
attentions of both pairs early. A job whose record exists (<records>/<study>/records/<attention>_seed<seed>.json.gz)
is skipped; any other trains with `nmt-train experiment=bottleneck` in <runs>/<study>/<attention>_seed<seed>
(`trainer.resume=auto`, the default: an interrupted run continues exactly from its last.pt), then
`nmt-study <run dir> --threads 1` decodes it (greedy and beam 5) and its record is copied into the records
directory and, with --commit, committed alone (`git commit --only`), so the study grows record by record across
machines and days. `nmt-study <records>/<study>/records` builds the study from whatever records exist.

Each job runs on one thread (the preset's trainer.threads=1), so --parallel 2 fills a 2-core machine. With
--no-start-after a job is not started after that time (a run cut off when the machine goes away is lost, its
checkpoints being outside the repository); running jobs finish.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

log = logging.getLogger("study_queue")

# study name -> the preset overrides that make it (the source language; English is the target of both)
STUDIES = {"caption_windows": ["data.src_lang=de"], "caption_windows_fr": ["data.src_lang=fr"]}


@dataclass(frozen=True)
class Job:
    study: str
    attention: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.attention}_seed{self.seed}"


def jobs(studies: list[str], attentions: list[str], seeds: list[int]) -> list[Job]:
    """Seed by seed, then study, then attention: a seed's runs of both pairs finish together."""
    return [Job(s, a, seed) for seed in seeds for s in studies for a in attentions]


def record_path(records: Path, job: Job) -> Path:
    return records / job.study / "records" / f"{job.name}.json.gz"


def train_command(job: Job, run_dir: Path, data_root: str, extra: list[str]) -> list[str]:
    return [
        "nmt-train",
        "experiment=bottleneck",
        f"attention={job.attention}",
        f"seed={job.seed}",
        f"data.root={data_root}",
        *STUDIES[job.study],
        "hydra.mode=RUN",
        f"hydra.run.dir={run_dir}",
        "trainer.progress=false",
        *extra,
    ]


def finished(run_dir: Path) -> bool:
    """A run whose training ended (metrics.json written at its end) and whose best.pt exists."""
    return (run_dir / "metrics.json").is_file() and (run_dir / "checkpoints" / "best.pt").is_file()


def run_job(job: Job, args: argparse.Namespace) -> Path:
    """Train (or resume) and record one job; returns the record's path in the records directory."""
    run_dir = (args.runs / job.study / job.name).resolve()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    out = run_dir.parent / f"{job.name}.out"
    with out.open("a") as log_file:
        if not finished(run_dir):
            cmd = train_command(job, run_dir, args.data_root, args.extra)
            log.info("%s: %s", job.name, " ".join(cmd))
            subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, check=True)
        study_dir = run_dir.parent / f"{job.name}.study"
        shutil.rmtree(study_dir, ignore_errors=True)
        cmd = ["nmt-study", str(run_dir), "--threads", "1", "--output", str(study_dir)]
        log.info("%s: %s", job.name, " ".join(cmd))
        subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, check=True)
    made = sorted((study_dir / "records").glob("*.json.gz"))
    if len(made) != 1:
        raise RuntimeError(f"{study_dir}/records: expected one record, found {len(made)}")
    target = record_path(args.records, job)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(made[0], target)
    return target


def commit(path: Path, job: Job) -> None:
    """Commit this record alone; wait while the checkout is in a merge or another git command holds the index."""
    repo = Path(
        subprocess.run(
            ["git", "-C", str(path.parent), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    git_dir = repo / ".git"
    for _ in range(120):
        if not (git_dir / "MERGE_HEAD").exists() and not (git_dir / "index.lock").exists():
            subprocess.run(["git", "-C", str(repo), "add", str(path)], check=True)
            done = subprocess.run(
                [
                    "git",
                    "-C",
                    str(repo),
                    "commit",
                    "-q",
                    "--only",
                    str(path),
                    "-m",
                    f"Study record: {job.study} {job.name} (plateau-stopped)",
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                log.info("%s: committed %s", job.name, path)
                return
            log.warning("%s: git commit failed (%s); retrying", job.name, done.stderr.strip())
        time.sleep(30)
    log.error("%s: record written but not committed: %s", job.name, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--records", type=Path, required=True, help="folder of the studies (<study>/records/ inside)")
    p.add_argument("--runs", type=Path, required=True, help="folder for the run directories (checkpoints)")
    p.add_argument("--data-root", default="../shared/data/multi30k", help="Multi30k's raw files (data.root)")
    p.add_argument("--studies", default=",".join(STUDIES), help="comma-separated: " + ", ".join(STUDIES))
    p.add_argument("--attentions", default="luong,bahdanau,none", help="the longest-training first (default)")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--parallel", type=int, default=2, help="jobs at a time, one thread each (default: 2)")
    p.add_argument("--no-start-after", default=None, help="ISO time after which no job starts (e.g. 17:50)")
    p.add_argument("--commit", action="store_true", help="commit each record as it is written")
    p.add_argument("extra", nargs="*", help="more nmt-train overrides for every job (e.g. trainer.amp=off)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    studies = [s for s in args.studies.split(",") if s]
    unknown = [s for s in studies if s not in STUDIES]
    if unknown:
        p.error(f"--studies: unknown {unknown}; known: {sorted(STUDIES)}")
    deadline = None
    if args.no_start_after:
        t = datetime.fromisoformat(args.no_start_after) if "T" in args.no_start_after else None
        deadline = t or datetime.combine(datetime.now().date(), datetime.strptime(args.no_start_after, "%H:%M").time())
    todo = [
        j
        for j in jobs(studies, args.attentions.split(","), [int(s) for s in args.seeds.split(",")])
        if not record_path(args.records, j).is_file()
    ]
    log.info("%d jobs to do: %s", len(todo), ", ".join(f"{j.study}/{j.name}" for j in todo))
    running: dict[int, Job] = {}
    failed = 0
    while todo or running:
        while todo and len(running) < args.parallel and (deadline is None or datetime.now() < deadline):
            job = todo.pop(0)
            pid = os.fork()
            if pid == 0:  # the child trains and records one job
                try:
                    run_job(job, args)
                    os._exit(0)
                except Exception as e:  # noqa: BLE001 - reported by the parent through the exit status
                    log.error("%s/%s failed: %s", job.study, job.name, e)
                    os._exit(1)
            running[pid] = job
        if not running:
            log.info("no job starts after %s; %d left", deadline, len(todo))
            break
        pid, status = os.wait()
        job = running.pop(pid)
        if os.waitstatus_to_exitcode(status) == 0:
            log.info("%s/%s recorded", job.study, job.name)
            if args.commit:
                commit(record_path(args.records, job), job)
        else:
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
