"""Checkpoint files: a kill at any moment of a save leaves the previous checkpoint loadable.

(Broken and foreign checkpoints as the commands meet them: test_cli_errors.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from nmt.checkpoint import load_checkpoint, save_checkpoint

ENV = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "NMT_DEBUG")}

KILLED_SAVE = """
import io, pathlib, sys, time
import torch
import nmt.checkpoint as checkpoint

path, ready, where = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]

def wait_to_be_killed(*args):
    ready.touch()
    time.sleep(120)

if where == "mid-write":  # half of the bytes are on disk when the process dies
    real_save = torch.save
    def half_save(obj, f):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[: buffer.tell() // 2])
        f.flush()
        wait_to_be_killed()
    torch.save = half_save
else:  # everything is written and synced, the rename has not happened
    checkpoint.os.replace = wait_to_be_killed
checkpoint.save_checkpoint(path, {"step": 2, "weights": torch.randn(100, 100)})
"""


@pytest.mark.parametrize("where", ["mid-write", "before-rename"])
def test_a_kill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, where):
    last = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint(last, {"step": 1, "weights": torch.zeros(3)})
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(last), str(ready), where], env=ENV)
    deadline = time.time() + 120
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert ready.exists(), "the child never reached the save"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    left = [p.name for p in last.parent.iterdir()]
    assert sorted(left) == sorted(["last.pt", f".last.pt.tmp{proc.pid}"])  # the dead process's temp file
    assert load_checkpoint(last)["step"] == 1
    save_checkpoint(last, {"step": 3})  # the next save succeeds and sweeps the dead process's leftovers
    assert [p.name for p in last.parent.iterdir()] == ["last.pt"] and load_checkpoint(last)["step"] == 3


def test_provenance_loads_and_torch_version_is_a_plain_string(tmp_path):
    """A checkpoint's provenance is plain values; checkpoints that stored torch's TorchVersion object
    (a str subclass, refused by weights_only loading unless allowed) still load."""
    from nmt.provenance import provenance

    facts = provenance(1)
    assert type(facts["torch"]) is str and facts["torch"] == str(torch.__version__)
    save_checkpoint(tmp_path / "plain.pt", {"provenance": facts})
    assert load_checkpoint(tmp_path / "plain.pt")["provenance"] == facts
    save_checkpoint(tmp_path / "old.pt", {"provenance": {"torch": torch.__version__}})
    assert load_checkpoint(tmp_path / "old.pt")["provenance"]["torch"] == str(torch.__version__)
