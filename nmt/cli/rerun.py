"""nmt-train run again: Ctrl-C, then the same command, continues; nothing is left behind by a refusal.

- An interrupted run (Ctrl-C, SIGTERM) ends by printing the one command that continues it (`continue_command`):
  the same overrides with `hydra.run.dir=<its directory>`.
- Running the same command again (the same overrides, no hydra.run.dir: each run gets a new
  outputs/<date>/<time>/) continues the newest run of that command when it stopped before its end: interrupted,
  or killed (`continue_interrupted`, before Hydra makes a directory: it adds hydra.run.dir=<that run> to the
  command line). Where that run is still training (its directory's lock is held: nmt.rundir.claim) it refuses in
  one line. `trainer.resume=never` starts afresh; a run that finished is never continued.
- A run refused or interrupted before it trained (a bad corpus, a resume refused, Ctrl-C) leaves no directory of
  its own behind (`no_empty_run_dir`); a directory another process holds, or one that existed before, is never
  removed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from nmt.cli.strict import CommandLine
from nmt.errors import ConfigError, NMTError
from nmt.rundir import LOCK, abandon, made_here

# what a run directory holds before training starts: Hydra's record of the config, the log and the lock
BEFORE_TRAINING = {".hydra", "train.log", LOCK}
# overrides the continuing command leaves out: where the run began from, and a deletion of its checkpoints
NOT_REPEATED = ("trainer.resume=", "trainer.overwrite=", "hydra.run.dir=")


def continue_command(task: Sequence[str], hydra: Sequence[str], run_dir: Path, world_size: int = 1) -> str:
    """The command that continues the run in `run_dir`: nmt-train, its overrides (`task`, `hydra`: Hydra's record
    of them) without trainer.resume and trainer.overwrite, and hydra.run.dir=`run_dir`."""
    kept = [o for o in [*task, *hydra] if not o.lstrip("+").startswith(NOT_REPEATED)]
    start = ["nmt-train"] if world_size == 1 else ["torchrun", f"--nproc_per_node={world_size}", "-m", "nmt.cli.train"]
    return shlex.join([*start, *kept, f"hydra.run.dir={run_dir}"])


def done_message(summary: dict, command: str | None) -> str:
    """nmt-train's last line(s): why it stopped, the best validation and its checkpoint (or, before any
    validation, last.pt), and for an interrupted run the command that continues it."""
    best = summary["best"]
    head = (
        f"done ({summary['stopped_by']}) after {summary['step']} steps, {summary['epoch']} epochs, "
        f"{summary['train_minutes']} min; "
    )
    if best:
        head += (
            f"best {best.get('metric')} at step {best.get('step')}: BLEU {best.get('bleu')} chrF {best.get('chrf')} "
            f"ppl {best.get('ppl')} -> {summary['best_checkpoint']}"
        )
    else:
        head += f"no validation yet -> {summary['last_checkpoint']}"
    return head if command is None else f"{head}\ncontinue it with: {command}"


def run_state(run_dir: Path) -> str | None:
    """How the run in `run_dir` stands: "running" while a trainer holds its lock; else its metrics.json's
    stopped_by (interrupted, max_steps, ...), or "killed" where checkpoints/last.pt is newer than any metrics.json
    (the record of an end); None without last.pt."""
    last, metrics = run_dir / "checkpoints" / "last.pt", run_dir / "metrics.json"
    if not last.is_file():
        return None
    if holder(run_dir):
        return "running"
    if not metrics.is_file() or metrics.stat().st_mtime < last.stat().st_mtime:
        return "killed"
    try:
        return json.loads(metrics.read_text(encoding="utf-8")).get("stopped_by") or "killed"
    except (OSError, ValueError):
        return "killed"


def holder(run_dir: Path) -> str | None:
    """Who holds `run_dir`'s lock now ("pid N on host", as nmt.rundir.claim writes it), or None where it is free."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a trainer holds it exclusively; released at close
        return None
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid not written yet"
    except OSError:  # a file system without locks
        return None
    finally:
        os.close(fd)


def newest_run_of(root: Path, task: list[str]) -> Path | None:
    """The run directory root/*/* (outputs/<date>/<time>) with a checkpoint whose recorded overrides are `task`,
    its last.pt the newest; None if there is none."""
    runs = []
    for overrides in root.glob("*/*/.hydra/overrides.yaml"):
        run = overrides.parent.parent
        if (run / "checkpoints" / "last.pt").is_file() and OmegaConf.to_container(OmegaConf.load(overrides)) == task:
            runs.append(run)
    return max(runs, key=lambda r: (r / "checkpoints" / "last.pt").stat().st_mtime, default=None)


def continue_interrupted(line: CommandLine) -> list[str]:
    """Before Hydra runs (nmt.cli.strict calls this with the checked command line): where this command ran before
    without hydra.run.dir and its newest run stopped before its end (interrupted, killed), continue that run (the
    argument hydra.run.dir=<it> to add); where that run is still training, a ConfigError saying how to go on."""
    cfg, hydra = line.cfg, line.hydra
    if line.multirun or cfg.hydra.mode == RunMode.MULTIRUN or any(o.startswith("hydra.run.dir=") for o in hydra):
        return []
    if cfg.trainer.resume not in (None, "auto") or cfg.trainer.overwrite:
        return []
    root = Path(cfg.hydra.run.dir).parent.parent  # outputs/ of outputs/<date>/<time>
    run = newest_run_of(root, line.task)
    state = None if run is None else run_state(run)
    if state == "running":
        raise ConfigError(
            f"{run} holds a run of this same command that is still training ({holder(run) or 'it just ended'}); "
            "wait for it to end, or start another beside it with trainer.resume=never"
        )
    if state not in ("interrupted", "killed"):
        return []  # nothing ran before, or it finished: a fresh run
    how = "interrupted run" if state == "interrupted" else "run, killed before its end,"
    print(
        f"nmt-train: continuing the {how} of this same command in {run} (trainer.resume=never starts afresh instead)",
        file=sys.stderr,
    )
    return [f"hydra.run.dir={run}"]


def this_command(run_dir: Path, world_size: int) -> str | None:
    """The command that continues this process's run (in `run_dir`), from Hydra's record of its command line;
    None outside a Hydra command."""
    if not HydraConfig.initialized():
        return None
    overrides = HydraConfig.get().overrides
    shown = run_dir.relative_to(Path.cwd()) if run_dir.is_relative_to(Path.cwd()) else run_dir
    return continue_command(list(overrides.task), list(overrides.hydra), shown, world_size)


@contextmanager
def no_empty_run_dir(run_dir: Path) -> Iterator[None]:
    """A run refused (an NMTError) or interrupted (Ctrl-C) before it trained leaves no directory of its own behind
    (`forget_unused`), so that a failed attempt does not look like a run."""
    try:
        yield
    except (NMTError, KeyboardInterrupt):
        forget_unused(run_dir)
        raise


def forget_unused(run_dir: Path) -> None:
    """Remove `run_dir` where this process made it (nmt.rundir.made_here: it did not exist before this command
    claimed it, and this process holds its lock, so nothing in it is another's) and it holds nothing but Hydra's
    record, the log and the lock; outputs/<date>/ goes too where it was made for it and is then empty. A directory
    that existed before (a run resumed there, another trainer's) is never removed, nor the folder we stand in."""
    here = Path.cwd().resolve()
    ours = run_dir.resolve() != here and run_dir.resolve() not in here.parents
    if ours and made_here(run_dir) and run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= BEFORE_TRAINING:
        abandon(run_dir)
