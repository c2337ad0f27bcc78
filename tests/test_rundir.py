"""A run directory under attack: checkpoints verified on load, one trainer per run directory, best.pt
consistent with metrics.json whenever a kill falls, and every failed write one line with the checkpoints intact.

The run is tiny (the quick preset on 300 pairs, best by validation loss so that each validation improves), trained
in this process; the commands run in subprocesses as a user runs them. Read-only folders and full disks are real: a
read-only bind mount or a small tmpfs in a user and mount namespace of their own (unshare), skipped where the kernel
allows none. (Kills at random instants of whole runs: scripts/kill_resume.py.)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.cli.common import build_run, compose_config
from nmt.errors import CheckpointError, CorruptCheckpoint

BIN = Path(sys.executable).parent
ENV = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "NMT_DEBUG")}
TINY = (  # the quick preset, tiny; best by validation loss, so that each validation improves and copies best.pt
    "experiment=quick data.train_size=300 data.valid_size=20 data.test_size=20 trainer.valid_every=3 "
    "trainer.best_metric=loss trainer.heatmaps=1 trainer.threads=1 trainer.progress=false"
).split()


def nmt_train(run_dir: Path, data_dir: Path, *overrides: str, mounts: str = "") -> subprocess.CompletedProcess:
    """nmt-train in `run_dir`; `mounts`: shell commands run first in a user and mount namespace of its own."""
    argv = [str(BIN / "nmt-train"), *TINY, f"hydra.run.dir={run_dir}", f"paths.data_dir={data_dir}", *overrides]
    if mounts:
        argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", f'{mounts} && exec "$@"', "sh", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=ENV)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The error line of a command that failed as the CLI's user errors do: status 2, one line, no traceback."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert sum(line.startswith("error: ") for line in lines) == 1 and lines[-1].startswith("error: "), lines[-5:]
    return lines[-1]


def flip(path: Path, n: int = 3) -> None:
    """Flip `n` bytes in the middle of a file (its tensors' bytes, in a checkpoint), as the review did."""
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + n] = bytes(b ^ 0xFF for b in raw[middle : middle + n])
    path.write_bytes(bytes(raw))


def ckpt(run_dir: Path, name: str = "last.pt") -> Path:
    return run_dir / "checkpoints" / name


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def killed(data_dir, tmp_path_factory, one_thread) -> tuple[Path, dict]:
    """A run stopped at step 3, then extended to step 6 (best at 6) and killed between its writes of last.pt and
    best.pt: the files that leaves (best.pt and metrics.json of step 3), and the step-6 ones, to compare."""
    run, kept = tmp_path_factory.mktemp("killed") / "run", {}
    for steps, resume in ((3, None), (6, str(ckpt(run)))):
        cfg = compose_config([*TINY, f"trainer.max_steps={steps}", f"paths.data_dir={data_dir}"])
        build_run(cfg, run, resume=resume).train()
        kept[steps] = {p: (run / p).read_bytes() for p in ("checkpoints/best.pt", "metrics.json")}
    assert json.loads(kept[6]["metrics.json"])["best"]["step"] == 6  # the precondition: step 6 improved
    for p, content in kept[3].items():
        (run / p).write_bytes(content)
    return run, kept


@pytest.fixture
def run(killed, tmp_path) -> Path:
    """This test's copy of the killed run, its best.pt made consistent (as if the kill had come earlier)."""
    copy = Path(shutil.copytree(killed[0], tmp_path / "run"))
    for p, content in killed[1][6].items():
        (copy / p).write_bytes(content)
    return copy


# ------------------------------------------------------------------------------------------ digests (finding 2)
def test_flipped_bytes_are_refused_by_every_reader(run):
    from nmt.serve.models import load_models
    from nmt.study.runs import read_run_dir
    from nmt.translator import Translator

    flip(ckpt(run, "best.pt"))
    assert torch.load(ckpt(run, "best.pt"), weights_only=True)["step"] == 6  # torch alone loads it silently
    with pytest.raises(CorruptCheckpoint) as err:
        load_checkpoint(ckpt(run, "best.pt"))
    assert str(err.value).startswith(f"{ckpt(run, 'best.pt')}: corrupt checkpoint (its contents do not match the")
    assert "copy it again" in str(err.value) and "\n" not in str(err.value)
    for reader in (Translator.from_checkpoint, lambda p: load_models([str(p)]), lambda p: read_run_dir(run)):
        with pytest.raises(CheckpointError, match="corrupt checkpoint"):
            reader(ckpt(run, "best.pt"))


def test_a_checkpoint_without_a_digest_loads_as_before(run, caplog):
    """Checkpoints written before digests existed (a study's runs in progress) load, with a log line."""
    payload = torch.load(ckpt(run), weights_only=True)
    del payload["digest"]
    torch.save(payload, ckpt(run))
    with caplog.at_level(logging.INFO, logger="nmt.checkpoint"):
        assert load_checkpoint(ckpt(run))["step"] == 6
    assert "not verified" in caplog.text


def test_a_corrupt_checkpoint_is_not_resumed_unless_falling_back_is_asked(run, data_dir, caplog, one_thread):
    flip(ckpt(run))
    settings = [*TINY, "trainer.max_steps=9", f"paths.data_dir={data_dir}"]
    with pytest.raises(CorruptCheckpoint, match=r"corrupt checkpoint .*trainer\.resume_fallback=true"):
        build_run(compose_config(settings), run, resume=str(ckpt(run))).train()
    trainer = build_run(compose_config([*settings, "trainer.resume_fallback=true"]), run, resume=str(ckpt(run)))
    with caplog.at_level(logging.WARNING, logger="nmt.resume"):
        trainer.restore(ckpt(run))
    assert trainer.step == 6 and trainer.resumes[-1]["checkpoint"] == str(ckpt(run, "best.pt"))
    assert f"{ckpt(run)}: corrupt checkpoint" in caplog.text and f"resuming from {ckpt(run, 'best.pt')}" in caplog.text


# --------------------------------------------------------------------------------- one trainer a time (finding 3)
def test_a_second_trainer_is_refused_naming_the_first(run, data_dir):
    from nmt.rundir import claim, release

    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("seed: 1234\n")
    (run / "train.log").write_text("the first trainer's log\n")
    before = {p: (run / p).read_bytes() for p in (".hydra/config.yaml", "train.log", "checkpoints/last.pt")}
    claim(run)  # this process is the first trainer
    try:
        line = one_error_line(nmt_train(run, data_dir, "seed=2", "trainer.max_steps=9"))
    finally:
        release(run)
    assert line.startswith(f"error: {run}: another nmt-train (pid {os.getpid()} on ") and "hydra.run.dir=" in line
    assert {p: (run / p).read_bytes() for p in before} == before  # not even Hydra's files were touched


# ------------------------------------------------------------------- the next start after a kill (findings 3, 4)
def test_the_next_start_repairs_what_a_kill_left(killed, data_dir, tmp_path):
    """best.pt and metrics.json one improvement behind last.pt, a temporary file and the lock of the dead trainer:
    the next start says what it repairs, and best.pt ends as metrics.json says."""
    run = Path(shutil.copytree(killed[0], tmp_path / "run"))
    (run / "checkpoints" / ".best.pt.tmp999999999").write_bytes(b"half a checkpoint")
    (run / ".lock").write_text("pid 999999999 on elsewhere\n")
    proc = nmt_train(run, data_dir, "trainer.max_steps=6")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        json.loads((run / "metrics.json").read_text())["best"]["step"] == load_checkpoint(ckpt(run, "best.pt"))["step"]
    )
    assert ckpt(run, "best.pt").read_bytes() == killed[1][6]["checkpoints/best.pt"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    log = (run / "train.log").read_text()
    assert f"{ckpt(run, 'best.pt')}: repaired from last.pt: it held step 3, but the run's best is step 6" in log
    assert "removed the temporary files of interrupted writes" in log and ".best.pt.tmp999999999" in log
    assert "took over the lock left by pid 999999999 on elsewhere" in log


# ------------------------------------------------------------------------------ failed writes (finding 7)
def namespaces_work() -> bool:
    try:
        cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /mnt"]
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def read_only(path: Path) -> str:
    return f"mount --bind {path} {path} && mount -o remount,bind,ro {path}"


WRITES = {  # what fails -> (the mounts, the path the error names, what it says)
    "read-only run directory": (lambda r: read_only(r), lambda r: r, "Read-only file system; make it writable"),
    "read-only checkpoints": (lambda r: read_only(r / "checkpoints"), lambda r: r / "checkpoints", "make it writable"),
    "a full disk under train.log and tensorboard/": (
        lambda r: f"ln -s /dev/full {r / 'train.log'} && mount -t tmpfs -o size=8k tmpfs {r / 'tensorboard'}",
        lambda r: r / "tensorboard",
        "could not write TensorBoard's events: No space left on device; free disk space",
    ),
}


@pytest.mark.skipif(not namespaces_work(), reason="no user and mount namespaces here (unshare) for read-only mounts")
def test_every_failed_write_is_one_line_naming_the_path_and_the_fix(run, data_dir):
    """A read-only run directory (before: Hydra's "Unable to configure handler 'file'"), a read-only checkpoints
    folder (before: found at the first save, with the fix for a full disk), a full disk under train.log (before: a
    "Logging error" traceback at every line) and TensorBoard's writer (before: OSError from add_figure): one line
    each, the checkpoints untouched."""
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    with ThreadPoolExecutor(len(WRITES)) as pool:  # each in its own copy of the run
        copies = {name: Path(shutil.copytree(run, run.parent / f"run{i}")) for i, name in enumerate(WRITES)}
        procs = {
            name: pool.submit(nmt_train, r, data_dir, "trainer.max_steps=9", mounts=WRITES[name][0](r))
            for name, r in copies.items()
        }
        for name, r in copies.items():
            _, path, says = WRITES[name]
            line = one_error_line(procs[name].result())
            assert line.startswith(f"error: {path(r)}: could not write ") and says in line, (name, line)
            assert "hydra.run.dir=..." in line
            assert {p.name: p.read_bytes() for p in (r / "checkpoints").iterdir()} == before, name
