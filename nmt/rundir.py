"""A run directory's files: one trainer at a time, best.pt consistent with metrics.json, every failed write one line.

    claim(run_dir)            # at start: run_dir/.lock (flock) held until the process exits, or a RunDirError
                              # naming the other trainer's pid; then every folder of the run must be writable
    tidy(run_dir)             # at start, under the lock: temporaries of interrupted writes removed; best.pt
                              # repaired from last.pt where a kill fell between the two (and said so)
    keep_best(run_dir)        # at an improving validation, after last.pt: best.pt := a copy of last.pt
    write_summary(run_dir, summary)               # metrics.json, atomically
    writer = TensorBoard(run_dir / "tensorboard") # SummaryWriter whose failures are one RunDirError

The order of writes makes a kill at any instant safe. At an improving validation last.pt is written first and
best.pt copied from it (both atomically): a kill between the two leaves last.pt recording a best at its own step
that best.pt does not hold, which the next start (tidy) sees and repairs by copying last.pt again. metrics.json,
the run's summary, is written at the end, after both; an earlier end's metrics.json is removed before best.pt
changes (a finished run extended with a larger budget), so that it never names another best than best.pt's.
A write that fails (a full disk, a read-only folder) is a RunDirError or CheckpointError naming the path and the
fix: nmt-train prints it as one line, and the checkpoints already written stay intact.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from nmt.atomic import atomic_path
from nmt.checkpoint import copy_checkpoint, load_checkpoint, peek_checkpoint
from nmt.errors import CheckpointError, RunDirError, write_failure

log = logging.getLogger(__name__)
LOCK = ".lock"  # in the run directory: "pid <pid> on <host>" of the trainer holding it, empty once released
FOLDERS = (".hydra", "checkpoints", "tensorboard", "valid")  # written into by a run, where they exist
MIN_FREE = 1 << 20  # bytes a run directory's disk must have at start (.hydra/ and train.log need a few KiB)
_held: dict[str, _Held] = {}  # realpath -> what this process holds


def claim(run_dir: str | Path, report: bool = True) -> None:
    """Hold `run_dir` for this process until it exits, and check that the run can write there.

    A RunDirError when another process holds it (naming its pid) or when the directory or one of its folders
    cannot be written, its disk full included (naming the path and the fix); the folders this call made are then
    removed again. A lock left by a process that died (kill -9) is free to the kernel: it is taken over, with a
    warning naming the dead process. Claiming a directory this process holds already does nothing, but logs a
    takeover that `report=False` (before logging is set up) kept back.
    """
    run_dir = Path(run_dir)
    key = os.path.realpath(run_dir)
    if key in _held:
        held = _held[key]
        if held.note and report:
            log.warning("%s", held.note)
            held.note = None
        return
    made = _first_missing(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        _remove_made(run_dir, made)
        raise RunDirError(_cannot_write(run_dir, "the run directory", e)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd) or "pid not written yet"
        os.close(fd)
        raise RunDirError(
            f"{run_dir}: another nmt-train ({holder}) is training in this run directory; wait for it to end or "
            "stop it, or train in another directory with hydra.run.dir=..."
        ) from None
    except OSError as e:  # a file system without locks (some network mounts): go on, unprotected
        log.warning("%s: cannot be locked (%s): nothing keeps a second trainer out", run_dir / LOCK, e.strerror)
    left = _holder(fd)
    note = f"{run_dir / LOCK}: took over the lock left by {left}, which ended without releasing it" if left else None
    if not _held:
        atexit.register(_release_all)
    _held[key] = _Held(fd, None if report else note, made)
    try:
        _check_room(run_dir, fd)
    except RunDirError:
        abandon(run_dir)
        raise
    if note and report:
        log.warning("%s", note)


@dataclass
class _Held:
    fd: int  # the lock file's descriptor
    note: str | None  # a takeover not yet logged
    made: Path | None  # the topmost folder the claim made (the run directory, or e.g. outputs/<date>); None: none


def _first_missing(path: Path) -> Path | None:
    """The topmost folder of `path` (itself or a parent; absolute) that does not exist yet; None where `path` exists."""
    path, missing = Path(os.path.abspath(path)), None
    for folder in (path, *path.parents):
        if folder.exists():
            return missing
        missing = folder
    return missing


def _check_room(run_dir: Path, fd: int) -> None:
    """Write this process's pid into the lock, and check that every folder of the run can be written and that
    the disk has room for what Hydra writes next (.hydra/, train.log), which would otherwise fail with a traceback."""
    full = (
        f"{run_dir}: its disk is full ({{free}} KiB free); free disk space or choose another run directory with "
        "hydra.run.dir=..."
    )
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise RunDirError(full.format(free=0)) from None
        raise RunDirError(_cannot_write(run_dir / LOCK, "the lock", e)) from None
    for folder in (run_dir, *(run_dir / name for name in FOLDERS)):
        writable(folder, must_exist=False)
    disk = os.statvfs(run_dir)
    if disk.f_bavail * disk.f_frsize < MIN_FREE:
        raise RunDirError(full.format(free=disk.f_bavail * disk.f_frsize // 1024))


def release(run_dir: str | Path) -> None:
    """Give up a run directory this process claimed (at exit this happens by itself)."""
    held = _held.pop(os.path.realpath(run_dir), None)
    if held:
        with contextlib.suppress(OSError):  # a full disk: the kernel releases the lock all the same
            os.ftruncate(held.fd, 0)
        os.close(held.fd)


def made_here(run_dir: str | Path) -> Path | None:
    """The topmost folder this process's claim of `run_dir` made (`run_dir`, or a parent such as outputs/<date>),
    while this process holds it; None where `run_dir` existed before the claim, or is not held here."""
    held = _held.get(os.path.realpath(run_dir))
    return held.made if held else None


def abandon(run_dir: str | Path) -> bool:
    """Release `run_dir`; where this process made it (`made_here`: it did not exist before the claim, so everything
    in it was written by this process, which holds its lock), first remove it, and the folders above it that its
    claim made and that are then empty. A directory that existed before is left as it is. Whether it was removed."""
    run_dir = Path(run_dir)
    made = made_here(run_dir)
    _remove_made(run_dir, made)
    release(run_dir)
    return made is not None


def _remove_made(run_dir: Path, made: Path | None) -> None:
    """Remove `run_dir` and its parents up to `made` (the topmost folder made for it) while they are empty."""
    if made is None:
        return
    run_dir = Path(os.path.abspath(run_dir))
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in run_dir.parents:
        if made != folder and made not in folder.parents:
            break
        try:
            folder.rmdir()  # only where empty: another run may have been made beside it meanwhile
        except OSError:
            break


def writable(folder: Path, must_exist: bool = True) -> None:
    """A RunDirError naming `folder` and the fix when a file cannot be created in it (read-only, no permission);
    a missing folder is created when `must_exist` (a multirun's sweep directory), else left to whoever writes it."""
    try:
        if must_exist:
            folder.mkdir(parents=True, exist_ok=True)
        elif not folder.is_dir():
            return
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise RunDirError(_cannot_write(folder, "into it", e)) from None


def _holder(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip()


def _release_all() -> None:
    """At exit: an empty lock file says that its last holder ended properly (the kernel drops the lock itself)."""
    for key in list(_held):
        with contextlib.suppress(OSError):
            release(key)


def _cannot_write(path: Path, what: str, e: BaseException) -> str:
    reason, fix = write_failure(e)
    return f"{path}: could not write {what}: {reason}; {fix}"


# ------------------------------------------------------------------------------------------ checkpoints
def tidy(run_dir: str | Path) -> None:
    """Put a run directory left by a killed trainer in order (call it holding the lock): remove the temporary
    files of interrupted writes, and repair best.pt from last.pt where a kill fell between the two."""
    run_dir = Path(run_dir)
    ckpts = run_dir / "checkpoints"
    stale = [p for p in [*ckpts.glob(".*.tmp*"), *run_dir.glob(".metrics.json.tmp*")] if _temporary(p)]
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    if stale:
        log.info("removed the temporary files of interrupted writes: %s", ", ".join(str(p) for p in stale))
    last, best = peek_checkpoint(ckpts / "last.pt"), peek_checkpoint(ckpts / "best.pt")
    if not last or not last.get("best"):
        return  # no run here, or an unreadable last.pt (resuming from it says why)
    want, held = last["best"].get("step"), best.get("step") if best else None
    if held == want or last.get("step") != want:
        return  # consistent; or best.pt is not last.pt's to repair (an edited directory: left alone)
    try:
        load_checkpoint(ckpts / "last.pt")  # verified before it replaces best.pt
    except CheckpointError:
        return
    keep_best(run_dir)
    log.warning(
        "%s: repaired from last.pt: it held %s, but the run's best is step %s (a kill or a failed write fell between "
        "saving last.pt and best.pt)",
        ckpts / "best.pt",
        f"step {held}" if best else "no readable checkpoint",
        want,
    )


def _temporary(path: Path) -> bool:
    """`.<name>.tmp<pid>`, as nmt.atomic names them."""
    return path.name.rpartition(".tmp")[2].isdigit()


def keep_best(run_dir: str | Path) -> None:
    """best.pt := a copy of checkpoints/last.pt (just written at an improving validation), after removing a
    metrics.json of an earlier end of the run, which would name another best."""
    run_dir = Path(run_dir)
    summary = run_dir / "metrics.json"
    if summary.exists():
        try:
            summary.unlink()
        except OSError as e:
            raise RunDirError(_cannot_write(summary, "(remove) the summary of an earlier end of the run", e)) from None
        log.info("%s removed: the run goes on past the end it records (it is written again at the end)", summary)
    copy_checkpoint(run_dir / "checkpoints" / "last.pt", run_dir / "checkpoints" / "best.pt")


# ------------------------------------------------------------------------------------------ other files
def write_summary(run_dir: str | Path, summary: dict) -> None:
    """metrics.json, atomically: a kill leaves the previous one or none, never half a file."""
    path = Path(run_dir) / "metrics.json"
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as e:
        raise RunDirError(_cannot_write(path, "the run's summary", e)) from None


def write_text(path: Path, text: str) -> None:
    """A file of the run (validation hypotheses), its folder made; a failure is one RunDirError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise RunDirError(_cannot_write(path, "the file", e)) from None


class TensorBoard(SummaryWriter):
    """TensorBoard's SummaryWriter for `folder`, with failures to write as one RunDirError naming the folder.

    The events are written by a thread of TensorBoard's, which keeps an error to raise it from the next call
    (add_figure after the disk filled up, typically): every call the trainer makes is guarded, and the thread's
    own report of that error (a traceback on stderr) is left out.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        _quiet_writer_threads()
        with self._guard():
            super().__init__(str(folder))

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise RunDirError(_cannot_write(self.folder, "TensorBoard's events", e)) from None

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        with self._guard():
            super().add_scalar(tag, value, step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        with self._guard():
            super().add_text(tag, text, step)

    def add_figure(self, tag: str, figure, step: int) -> None:
        with self._guard():
            super().add_figure(tag, figure, step)

    def flush(self) -> None:
        with self._guard():
            super().flush()

    def close(self) -> None:
        with self._guard():
            super().close()


def _quiet_writer_threads() -> None:
    """Leave out the traceback TensorBoard's writer thread prints when a write fails: its trainer reports it."""
    previous = threading.excepthook
    if getattr(previous, "nmt_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook.nmt_quiet = True
    threading.excepthook = hook
