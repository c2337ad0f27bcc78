"""nmt-train run again (nmt.cli.rerun): Ctrl-C prints the command that continues the run, the same command again
continues it (or a killed one) instead of starting over, one still training is named rather than joined, and a
finished run is never continued.

One real interrupted run (SIGINT) of a tiny quick preset, in a fresh working directory as a user would start it;
the other cases compose the real command line (nmt.cli.strict.check_command_line) over run directories laid out
as nmt-train leaves them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BIN, TINY

from nmt.cli.rerun import continue_interrupted, done_message, run_state
from nmt.cli.strict import check_command_line
from nmt.errors import ConfigError
from nmt.rundir import claim, release

ENV = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "NMT_DEBUG")}
STEPS = [*TINY, "trainer.max_steps=24", "trainer.valid_every=3"]  # a first checkpoint at step 3, then 21 more steps


def test_ctrl_c_prints_the_command_and_the_same_command_continues(tmp_path):
    cmd = [str(BIN / "nmt-train"), *STEPS, f"paths.data_dir={tmp_path / 'data'}"]
    first = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not list(tmp_path.glob("outputs/*/*/checkpoints/last.pt")) and time.time() < deadline:
        if first.poll() is not None:
            break
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-2000:]
    (run,) = [p.relative_to(tmp_path) for p in tmp_path.glob("outputs/*/*")]
    assert re.search(r"^done \(interrupted\) after \d+ steps", out, re.M), out
    assert "None" not in out.splitlines()[-2]  # no "best None at step None"
    expected = " ".join(["nmt-train", *STEPS, f"paths.data_dir={tmp_path / 'data'}", "hydra.mode=RUN"])
    assert out.splitlines()[-1] == f"continue it with: {expected} hydra.run.dir={run}"

    again = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"continuing the interrupted run of this same command in {run}" in again.stderr
    assert [p.relative_to(tmp_path) for p in tmp_path.glob("outputs/*/*")] == [run]  # no second directory
    metrics = json.loads((tmp_path / run / "metrics.json").read_text())
    assert metrics["stopped_by"] == "max_steps" and metrics["step"] == 24
    assert "resuming from" in (tmp_path / run / "train.log").read_text()


def lay_out(root: Path, name: str, overrides: list[str], stopped_by: str | None, metrics_first: bool = False) -> Path:
    """A run directory as nmt-train leaves it: .hydra/overrides.yaml, checkpoints/last.pt and, unless
    `stopped_by` is None, metrics.json written after last.pt (before it with `metrics_first`)."""
    run = root / "outputs" / "2026-01-01" / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run / "checkpoints").mkdir()
    stamps = (1_000, 2_000) if metrics_first else (2_000, 1_000)
    if stopped_by is not None:
        (run / "metrics.json").write_text(json.dumps({"stopped_by": stopped_by, "step": 7}))
        os.utime(run / "metrics.json", (stamps[0],) * 2)
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    os.utime(run / "checkpoints" / "last.pt", (stamps[1],) * 2)
    return run


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def plan(*argv: str) -> list[str]:
    return continue_interrupted(check_command_line("train", list(argv)))


def test_what_the_same_command_does_with_the_runs_before_it(here):
    assert plan("experiment=quick") == []  # nothing ran before: a fresh run
    lay_out(here, "00-00-01", ["experiment=quick"], "interrupted")
    assert plan("experiment=quick") == ["hydra.run.dir=outputs/2026-01-01/00-00-01"]
    assert plan("experiment=quick", "seed=2") == []  # another command
    assert plan("experiment=quick", "trainer.resume=never") == []  # asked to start afresh
    assert plan("experiment=quick", "hydra.run.dir=elsewhere") == []  # a directory of its own choosing
    assert plan("-m", "experiment=quick") == []  # a sweep
    newer = lay_out(here, "00-00-02", ["experiment=quick"], "max_steps")
    os.utime(newer / "checkpoints" / "last.pt", (3_000, 3_000))
    os.utime(newer / "metrics.json", (3_001, 3_001))
    assert run_state(newer) == "max_steps" and plan("experiment=quick") == []  # the newest finished: start afresh


@pytest.mark.parametrize("metrics", [None, "max_steps"], ids=["killed", "killed-after-a-finished-run"])
def test_a_killed_run_is_continued_and_a_running_one_named(here, metrics):
    run = lay_out(here, "00-00-01", ["experiment=quick"], metrics, metrics_first=True)
    assert run_state(run) == "killed"  # last.pt newer than any record of an end, and nobody holds the lock
    assert plan("experiment=quick") == [f"hydra.run.dir={run.relative_to(here)}"]
    claim(run)  # a trainer at work there (this process, through another file descriptor)
    try:
        assert run_state(run) == "running"
        with pytest.raises(ConfigError) as refused:
            plan("experiment=quick")
    finally:
        release(run)
    message = str(refused.value)
    assert message.startswith(f"{run.relative_to(here)} holds a run of this same command that is still training (pid ")
    assert "trainer.resume=never" in message


def test_before_any_validation_the_last_line_names_last_pt():
    summary = {"stopped_by": "interrupted", "step": 2, "epoch": 0, "train_minutes": 0.01, "best": {}}
    summary |= {"best_checkpoint": "run/checkpoints/best.pt", "last_checkpoint": "run/checkpoints/last.pt"}
    assert done_message(summary, "nmt-train hydra.run.dir=run").splitlines() == [
        "done (interrupted) after 2 steps, 0 epochs, 0.01 min; no validation yet -> run/checkpoints/last.pt",
        "continue it with: nmt-train hydra.run.dir=run",
    ]
