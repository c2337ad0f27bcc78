"""Nothing lost, whatever the commands meet: a refused multirun leaves the running job alone,
a flipped bit anywhere in a checkpoint is damage, 0 bytes free is one line before Hydra writes, nmt-evaluate checks
its outputs before decoding, Ctrl-C at any instant is one line, and a damaged data cache is prepared again.

The commands run in subprocesses as a user runs them. A job is kept in data preparation by a training file that is a
named pipe nobody writes to; full disks and read-only folders are real (a tmpfs or a read-only bind mount in a user
and mount namespace of their own, unshare), skipped where the kernel allows none, with an in-process twin where a
monkeypatched write stands in. (100 Ctrl-C at random instants of every command: scripts/sigint_storm.py.)
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from test_rundir import BIN, ENV, TINY, namespaces_work, one_error_line

from nmt.checkpoint import damaged_archive, load_checkpoint, save_checkpoint
from nmt.cli.common import build_run, compose_config, load_data
from nmt.errors import CheckpointError, CorruptCheckpoint, RunDirError
from nmt.resume import resumable

NAMESPACES = pytest.mark.skipif(not namespaces_work(), reason="no user and mount namespaces here (unshare)")


def start(argv: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, proc: subprocess.Popen | None = None, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def in_namespace(mounts: str, argv: list[str]) -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", f'{mounts} && exec "$@"', "sh", *argv]


# ------------------------------------------------------------------------ finding 1: a refused multirun
def test_a_refused_multirun_leaves_the_running_job_and_its_lock_alone(tmp_path):
    """Three commands: a multirun kept in data preparation, the same sweep again (refused, the first's directory
    intact, its lock included), and a third trainer pointed at that directory (refused)."""
    os.mkfifo(tmp_path / "train.tsv")  # nobody writes: the job waits in data preparation, holding its directory
    sweep = [str(BIN / "nmt-train"), "-m", "data=files", f"data.train={tmp_path / 'train.tsv'}", "hydra.sweep.dir=S"]
    sweep += ["seed=7", "trainer.threads=1", "trainer.progress=false", f"paths.data_dir={tmp_path / 'data'}"]
    job = tmp_path / "S" / "0_luong_seed7"
    first = start(sweep, tmp_path)
    try:
        wait_for(lambda: (job / "train.log").is_file() and (job / ".hydra" / "overrides.yaml").is_file(), first)
        before = snapshot(job)
        second = subprocess.run(sweep, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
        line = one_error_line(second)
        assert f"another nmt-train (pid {first.pid} on " in line and "S/0_luong_seed7" in line
        assert snapshot(job) == before  # not even Hydra's .hydra/ rewritten
        third = [str(BIN / "nmt-train"), "experiment=quick", f"hydra.run.dir={job}", f"paths.data_dir={tmp_path}/d"]
        line = one_error_line(subprocess.run(third, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300))
        assert f"another nmt-train (pid {first.pid} on " in line
        assert snapshot(job) == before and first.poll() is None
    finally:
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=120)
    assert first.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert not job.exists()  # interrupted before it trained: its own directory is not left looking like a run


def test_cleanup_never_removes_a_directory_that_existed_or_another_holds(tmp_path):
    from nmt.cli.rerun import forget_unused
    from nmt.rundir import claim, made_here, release

    existing = tmp_path / "existing"
    (existing / ".hydra").mkdir(parents=True)
    claim(existing)
    try:
        assert made_here(existing) is None
        forget_unused(existing)
        assert (existing / ".hydra").is_dir()
    finally:
        release(existing)
    fresh = tmp_path / "outputs" / "2026-01-01" / "12-00-00"
    claim(fresh)
    assert made_here(fresh) == tmp_path / "outputs"
    forget_unused(fresh)
    assert not (tmp_path / "outputs").exists()  # outputs/<date>/ too: made for this run, and empty


# ------------------------------------------------------------------------ finding 6: a flipped bit is damage
def small_checkpoint(path: Path, step: int) -> Path:
    save_checkpoint(path, {"model": {"w": torch.arange(6.0) * step}, "step": step, "config": {"data": {"x": 1}}})
    return path


def flipped(raw: bytes, offset: int, bit: int) -> bytes:
    damaged = bytearray(raw)
    damaged[offset] ^= 1 << bit
    return bytes(damaged)


def test_a_one_bit_flip_in_data_pkl_is_damage_and_resume_falls_back(tmp_path):
    """Every byte of data.pkl flipped in one bit (before: most read as "not an nmt checkpoint (it holds objects
    other than tensors ...)"), and a sample of the rest of the file: each is a CorruptCheckpoint or loads the very
    same values; trainer.resume_fallback then resumes from the intact checkpoint beside it."""
    last = small_checkpoint(tmp_path / "last.pt", 3)
    raw = last.read_bytes()
    with zipfile.ZipFile(last) as archive:
        pkl = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    start_ = pkl.header_offset + 30 + len(pkl.filename) + len(pkl.extra)  # the member's bytes
    offsets = [*range(start_, start_ + pkl.compress_size), *range(0, len(raw), 11)]
    for i, offset in enumerate(offsets):
        last.write_bytes(flipped(raw, offset, i % 8))
        try:
            payload = load_checkpoint(last)
        except CorruptCheckpoint:
            continue
        assert payload["step"] == 3 and payload["model"]["w"].tolist() == (torch.arange(6.0) * 3).tolist(), offset
    small_checkpoint(tmp_path / "best.pt", 2)
    last.write_bytes(flipped(raw, start_ + pkl.compress_size // 2, 3))
    with pytest.raises(CorruptCheckpoint, match="trainer.resume_fallback=true"):
        resumable(last, fallback=False)
    path, payload = resumable(last, fallback=True)
    assert path == tmp_path / "best.pt" and payload["step"] == 2


def test_a_foreign_file_is_still_not_an_nmt_checkpoint(tmp_path):
    """What is no damaged nmt file keeps its own message: a pickle of other objects saved whole, another zip."""
    torch.save({"format": "nmt-checkpoint", "evil": zipfile.ZipInfo("x")}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="not an nmt checkpoint .it holds objects other") as e:
        load_checkpoint(tmp_path / "evil.pt")
    assert not isinstance(e.value, CorruptCheckpoint) and damaged_archive(tmp_path / "evil.pt") is None
    with zipfile.ZipFile(tmp_path / "notes.pt", "w") as z:
        z.writestr("notes.txt", "hello")
    with pytest.raises(CheckpointError, match="not an nmt checkpoint") as e:
        load_checkpoint(tmp_path / "notes.pt")
    assert not isinstance(e.value, CorruptCheckpoint)


# ------------------------------------------------------------------------ finding 7: 0 bytes free
@NAMESPACES
def test_zero_bytes_free_is_one_line_before_hydra_writes(tmp_path):
    """nmt-train into a full tmpfs (before: a Hydra callback warning, then a traceback from _save_config, rc 1)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    fill = f"mount -t tmpfs -o size=64k tmpfs {disk} && (dd if=/dev/zero of={disk}/fill bs=4k 2>/dev/null; true)"
    argv = [str(BIN / "nmt-train"), *TINY, f"hydra.run.dir={disk}/run", f"paths.data_dir={tmp_path}/data"]
    proc = subprocess.run(in_namespace(fill, [*argv[:1], *argv[1:]]), capture_output=True, text=True, timeout=300)
    line = one_error_line(proc)
    assert line.startswith(f"error: {disk}/run: its disk is full (0 KiB free); free disk space or choose another")
    assert "callback" not in proc.stderr.lower()


def test_a_full_disk_at_the_lock_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
    """The same, where namespaces are not allowed: the lock's write fails with ENOSPC (monkeypatched os.pwrite)."""
    from nmt import rundir

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "pwrite", full)
    with pytest.raises(RunDirError, match=r"its disk is full \(0 KiB free\); free disk space"):
        rundir.claim(tmp_path / "outputs" / "2026-01-01" / "12-00-00")
    assert not (tmp_path / "outputs").exists()  # what the claim made is removed again


# ------------------------------------------------------------------------ finding 8: nmt-evaluate's outputs
@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    data = run.parent / "data"  # trained.parent / "data", for the commands
    cfg = compose_config([*TINY, "trainer.max_steps=3", f"paths.data_dir={data}"])
    build_run(cfg, run).train()
    return run


def nmt_evaluate(run: Path, output: Path, mounts: str) -> subprocess.CompletedProcess:
    argv = [str(BIN / "nmt-evaluate"), f"checkpoint={run}/checkpoints/last.pt", f"output={output}", "heatmaps=2"]
    argv += [f"paths.data_dir={run.parent}/data", "device=cpu"]
    return subprocess.run(in_namespace(mounts, argv), capture_output=True, text=True, timeout=300, env=ENV)


@NAMESPACES
def test_evaluate_checks_its_outputs_before_decoding_and_a_failed_write_is_one_line(trained, tmp_path):
    """A read-only output folder is refused before decoding (before: a traceback after decoding the whole test
    set); a disk that fills up while the files are written is one line naming the file, after the scores."""
    ro = tmp_path / "ro"
    ro.mkdir()
    proc = nmt_evaluate(trained, ro / "eval", f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}")
    line = one_error_line(proc)
    assert line.startswith(f"error: {ro}/eval: cannot write the evaluation's files there: Read-only file system")
    assert "output=..." in line and "translating" not in proc.stderr  # refused before decoding
    small = tmp_path / "small"
    small.mkdir()
    proc = nmt_evaluate(trained, small / "eval", f"mount -t tmpfs -o size=24k tmpfs {small}")
    line = one_error_line(proc)
    assert f"{small}/eval/" in line and "could not write it: No space left on device; free disk space" in line
    assert "BLEU" in proc.stdout  # the scores are printed all the same
    assert not [p for p in (small / "eval").rglob("*") if ".tmp" in p.name]  # no half-written file left


# ------------------------------------------------------------------------ finding 9: Ctrl-C at any instant
def interrupted(argv: list[str], cwd: Path, when) -> subprocess.CompletedProcess:
    """Run `argv`, send SIGINT once `when(proc)` is true, and return how it ended."""
    proc = start(argv, cwd)
    wait_for(lambda: when(proc) or proc.poll() is not None, timeout=240)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def quiet(proc: subprocess.CompletedProcess) -> None:
    """No traceback; exit 130 after one line, or 0 (the trainer stopped after a step); or ended by the signal
    without a word, where it came before Python itself had started (no handler of any program's exists yet)."""
    assert "Traceback" not in proc.stderr + proc.stdout and "KeyboardInterrupt" not in proc.stderr, proc.stderr[-3000:]
    before_python = proc.returncode == -signal.SIGINT and not proc.stderr.strip()
    assert proc.returncode in (0, 130) or before_python, (proc.returncode, proc.stderr[-3000:])


def after(seconds: float):
    started = time.time()
    return lambda proc: time.time() - started > seconds


def test_ctrl_c_in_a_commands_first_seconds_is_one_line_and_leaves_no_directory(tmp_path):
    """Ctrl-C while the modules load, while Hydra starts and while the data is prepared (before: a ~40-line
    KeyboardInterrupt traceback, exit by the signal, and outputs/<date>/<time> left behind)."""
    argv = [str(BIN / "nmt-train"), *TINY, f"paths.data_dir={tmp_path / 'data'}"]
    for when in (after(0.3), lambda _: (tmp_path / "outputs").exists(), after(4)):
        proc = interrupted(argv, tmp_path, when)
        quiet(proc)
        if proc.returncode == 130:
            assert proc.stderr.rstrip().endswith("nmt-train: interrupted"), proc.stderr[-500:]
            assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))
        shutil.rmtree(tmp_path / "outputs", ignore_errors=True)


SIGINT_WHILE_LOADING = """
import importlib.abc, os, signal, sys


class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "nmt.cli.interrupt":  # Ctrl-C while the module that handles it is being imported
            print(signal.getsignal(signal.SIGINT) is signal.SIG_DFL, file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, Interrupt())
"""


def test_ctrl_c_while_the_interrupt_handler_itself_loads_ends_the_command_without_a_word(tmp_path):
    """A Ctrl-C after Python has started the command but before nmt.cli.interrupt is imported (its imports take a
    few milliseconds): the signal's default action, no traceback; a library user's handler is left alone."""
    (tmp_path / "sitecustomize.py").write_text(SIGINT_WHILE_LOADING)  # imported by Python's start-up
    env = ENV | {"PYTHONPATH": str(tmp_path)}
    command = subprocess.run(
        [str(BIN / "nmt-train"), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert command.returncode == -signal.SIGINT, (command.returncode, command.stderr[-2000:])
    assert command.stderr.strip() == "True" and command.stdout == ""  # the default action, nothing printed
    library = subprocess.run(
        [sys.executable, "-c", "import nmt.cli"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    # the handler the process had (Python's, or ignored where the test runner's worker ignores SIGINT), untouched
    assert library.stderr.startswith("False\n"), library.stderr[-2000:]


def test_a_refused_command_leaves_no_empty_dated_folder(tmp_path):
    argv = [str(BIN / "nmt-train"), "data=files", f"data.train={tmp_path / 'missing.tsv'}"]
    one_error_line(subprocess.run(argv, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300))
    assert not (tmp_path / "outputs").exists()


def test_a_resume_interrupted_at_once_leaves_the_run_as_it_was(trained, tmp_path):
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    kept = {k: v for k, v in snapshot(run).items() if k.startswith(("checkpoints/", "metrics.json", "valid/"))}
    argv = [str(BIN / "nmt-train"), *TINY, "trainer.max_steps=30", f"hydra.run.dir={run}"]
    argv += [f"paths.data_dir={trained.parent}/data"]
    log = run / "train.log"
    proc = interrupted(argv, tmp_path, lambda _: log.is_file() and "resuming from" in log.read_text())
    quiet(proc)
    if proc.returncode == 130:  # interrupted before the trainer's own handler: nothing of the run changed
        assert {k: v for k, v in snapshot(run).items() if k in kept} == kept
    else:  # the trainer's handler came first: it stopped after a step, saved, and said how to continue
        assert "done (interrupted)" in proc.stdout


@pytest.mark.parametrize("command", ["nmt-evaluate", "nmt-translate", "nmt-study"])
def test_ctrl_c_while_the_other_commands_work_is_one_line(trained, tmp_path, command):
    checkpoint = trained / "checkpoints" / "last.pt"
    argv = {
        "nmt-evaluate": [f"checkpoint={checkpoint}", f"output={tmp_path}/eval", f"paths.data_dir={tmp_path}/data"],
        "nmt-translate": [str(checkpoint)],  # reads stdin, which stays open: it waits there
        "nmt-study": [str(trained.parent), "--output", str(tmp_path / "study")],
    }[command]
    for when in (after(1), after(3)):  # once Python runs (a Ctrl-C in its own start-up is Python's to report)
        proc = interrupted([str(BIN / command), *argv], tmp_path, when)
        quiet(proc) if proc.returncode != 2 else one_error_line(proc)  # 2: refused, e.g. no runs for nmt-study


# ------------------------------------------------------------------------ finding 10: a damaged data cache
def test_a_damaged_data_cache_is_prepared_again_in_one_line(tmp_path, caplog):
    """encoded.pt cut off, replaced by a pickle, or not matching its digest (before: a traceback ending in torch's
    `PytorchStreamReader failed reading zip archive`, or its advice to load with weights_only=False)."""
    cfg = compose_config([*TINY, f"paths.data_dir={tmp_path}"])
    first = load_data(cfg)
    encoded = first.cache_dir / "encoded.pt"
    good = encoded.read_bytes()

    damages = {
        "cut off": lambda: encoded.write_bytes(good[: len(good) // 2]),
        "a pickle": lambda: encoded.write_bytes(pickle.dumps({"encoded": Path("anything")})),
        "a flipped bit": lambda: encoded.write_bytes(flipped(good, len(good) // 2, 1)),
        "another tokenizer": lambda: (first.cache_dir / "spm.src.model").write_bytes(b"not a model"),
    }
    for name, damage in damages.items():
        damage()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nmt"):
            again = load_data(cfg)
        notes = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(notes) == 1 and notes[0].startswith(f"{encoded}: damaged prepared data ("), (name, notes)
        assert notes[0].endswith("preparing it again") and "weights_only" not in notes[0]
        assert again.fingerprints() == first.fingerprints(), name
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nmt"):
            load_data(cfg)  # prepared again: read back whole
        assert not caplog.records, name
    assert json.loads(json.dumps(torch.load(encoded, weights_only=True)["dropped"])) == first.dropped


SWALLOWED = """
import os, signal, sys, threading, time
from nmt.cli import interrupt
interrupt.install("nmt-demo")
class Slow:
    def __del__(self):
        time.sleep(0.3)  # the SIGINT lands here, where Python can only print it ("Exception ignored in ...")
with interrupt.running("nmt-demo"):
    slow = Slow()
    threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    del slow
    time.sleep(3)
    print("not interrupted")
"""


def test_a_ctrl_c_swallowed_in_a_destructor_is_delivered_again():
    """A KeyboardInterrupt raised in a __del__ (found by scripts/sigint_storm.py: printed with a traceback, and the
    command then ran to its end) is delivered again in the command's own code: one line, exit 130."""
    proc = subprocess.run([str(BIN / "python"), "-c", SWALLOWED], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 130 and "not interrupted" not in proc.stdout, (proc.stdout, proc.stderr)
    assert proc.stderr.strip() == "nmt-demo: interrupted"
