"""Shared fixtures: a small model trained once per test module on the synthetic task.

def test_something(quick_run):          # quick_run: the run directory of `nmt-train experiment=quick`
    checkpoint = quick_run / "checkpoints" / "best.pt"
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BIN = Path(sys.executable).parent  # the virtualenv's console scripts (nmt-train, nmt-evaluate, ...)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    """Train the `quick` preset for 200 steps (about 15 s on 2 CPU cores) and return its run directory."""
    root = tmp_path_factory.mktemp("quick")
    run_dir = root / "run"
    cmd = [
        str(BIN / "nmt-train"),
        "experiment=quick",
        f"hydra.run.dir={run_dir}",
        f"paths.data_dir={root / 'data'}",
        "trainer.progress=false",
        "trainer.max_steps=200",
        "trainer.threads=1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (run_dir / "checkpoints" / "best.pt").exists()
    return run_dir


@pytest.fixture(scope="session")
def torch_compiles() -> bool:
    """Whether torch.compile works on this machine (it needs a C++ compiler): the tests of the compiled
    kernels (nmt.kernels.compiled) are skipped where it does not."""
    try:
        torch.compile(lambda x: x.sigmoid() * 2, dynamic=True)(torch.randn(3))
    except Exception:  # no compiler, no Python headers: Inductor's errors have no common base
        return False
    return True


@pytest.fixture
def compiled(torch_compiles):
    """The compiled kernels (nmt.kernels.compiled) for one test; skipped where this machine cannot compile (no C++
    compiler). The autouse fixture below sets eager kernels again after the test."""
    if not torch_compiles:
        pytest.skip("torch.compile does not work on this machine (no C++ compiler?)")
    from nmt.kernels.compiled import set_kernels

    set_kernels("compiled")


@pytest.fixture(autouse=True)
def eager_kernels_after_each_test():
    """A Trainer chooses the process's kernels (nmt.kernels.compiled): put them back to eager after each test, so that
    tests of the eager code never run compiled kernels a Trainer of an earlier test chose."""
    yield
    from nmt.kernels.compiled import set_kernels

    set_kernels("eager")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module: tiny ops gain nothing from more, and on a shared 2-core machine
    two spinning OpenMP threads can be ten times slower, not faster."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def dress_as_chapters():
    """dress(corpus, window, seed, shortest, longest) -> corpus: its training pairs dressed as Bible chapters
    of shortest..longest consecutive verses (drawn from `seed`), trained in windows of up to `window`."""

    def dress(corpus, window: int, seed: int, shortest: int, longest: int):
        rng, n, chapters = random.Random(seed), len(corpus.splits["train"]), []
        while len(chapters) < n:
            chapters += [len(chapters) + 1] * rng.randint(shortest, longest)
        corpus.chapters, corpus.window = {"train": chapters[:n]}, window
        return corpus

    return dress
