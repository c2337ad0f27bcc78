"""The built wheel, installed (not editable) into a fresh virtual environment, carries everything a command
needs: the Hydra configs (as nmt.configs) and nmt-serve's page files. Its dependencies are borrowed from the
environment running the tests (a path line in a .pth file, which adds no editable install), so the test
needs no download."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment with the project's wheel installed; returns its bin/ folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next((tmp / "dist").glob("nmt-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", where], check=True, capture_output=True, text=True
    ).stdout.strip()
    (Path(purelib) / "borrowed_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]  # this environment's pip (>= 22.3)
    subprocess.run(  # installs into the new one, which needs no pip of its own
        [*pip, "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return venv / "bin"


def test_the_wheel_carries_the_configs_the_page_files_and_the_kernels(installed):
    probe = (
        "import nmt, nmt.cli.common as c, nmt.serve.app as s, nmt.kernels.additive_step as a, "
        "nmt.kernels.lstm_cell as l; "
        "print(nmt.__file__); print(c.CONFIG_DIR); "
        "print((s.STATIC_DIR / 'serve.js').is_file() and a.SOURCE.is_file() and l.CELL_SOURCE.is_file()); "
        "print(','.join(sorted(p.name for p in a.SOURCE.parent.iterdir())))"
    )
    out = subprocess.run(
        [str(installed / "python"), "-c", probe], check=True, capture_output=True, text=True, cwd=installed.parent
    ).stdout.split()
    venv = str(installed.parent)
    assert out[0].startswith(venv) and out[1].startswith(venv), out  # the wheel's copy, not this checkout
    assert (Path(out[1]) / "train.yaml").is_file() and (Path(out[1]) / "experiment" / "quick.yaml").is_file()
    assert out[2] == "True"
    # every kernel source and every header they include (nmt.kernels.compiled.source_text)
    assert out[3].split(",") == sorted(p.name for p in (ROOT / "nmt" / "kernels" / "csrc").iterdir()), out[3]


@pytest.mark.slow
def test_the_installed_commands_answer_help_and_train(installed, tmp_path):
    help_text = subprocess.run(
        [str(installed / "nmt-train"), "--help"], check=True, capture_output=True, text=True, cwd=tmp_path, timeout=120
    ).stdout
    assert "experiment=quick" in help_text
    cmd = [
        str(installed / "nmt-train"),
        "experiment=quick",
        "trainer.max_steps=5",
        "trainer.valid_every=5",
        "trainer.progress=false",
        "trainer.threads=1",
        "data.train_size=200",
        "data.valid_size=10",
        "data.test_size=10",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"paths.data_dir={tmp_path / 'data'}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "best.pt").is_file()
