"""Shared fixtures: a small model trained once per test module on the synthetic task.

def test_something(quick_run):          # quick_run: the run directory of `nmt-train experiment=quick`
    checkpoint = quick_run / "checkpoints" / "best.pt"
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

BIN = Path(sys.executable).parent  # the virtualenv's console scripts (nmt-train, nmt-evaluate, ...)
# the quick preset shrunk to seconds: 300 training pairs, 6 steps validated once, one thread, no progress bar
TINY = [
    "experiment=quick",
    "data.train_size=300",
    "data.valid_size=20",
    "data.test_size=20",
    "trainer.max_steps=6",
    "trainer.valid_every=6",
    "trainer.heatmaps=0",
    "trainer.threads=1",
    "trainer.progress=false",
]


# The test files that take longest, longest first (CI's 2 cores). pytest-xdist (pyproject's addopts:
# `-n 2 --dist loadfile --no-loadscope-reorder`) hands whole files to its two workers in collection order, so these
# start first and the many short files fill in at the end, when one worker would otherwise idle.
SLOWEST_FIRST = (
    "test_learning.py",
    "test_benchmark.py",
    "test_train.py",
    "test_cli_errors.py",
    "test_inference.py",
    "test_distributed.py",
    "test_study.py",
    "test_serve.py",
    "test_nothing_lost.py",
    "test_performance_doc.py",
    "test_model.py",
    "test_energy.py",
    "test_cpp_kernels.py",
    "test_packaging.py",
    "test_resume.py",
    "test_rundir.py",
    "test_rerun.py",
)


def pytest_configure(config):
    """Under pytest-xdist each worker computes on one thread, and so do the commands its tests start that do not
    choose their own thread count (OMP_NUM_THREADS, unless set): two workers of two OpenMP threads each on two
    cores would spin against each other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """The slowest files first (SLOWEST_FIRST), the others after them in their usual order."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    """Train the `quick` preset for 100 steps on 2,000 of its sentences (about 7 s on one core; test BLEU near 50)
    and return its run directory."""
    root = tmp_path_factory.mktemp("quick")
    run_dir = root / "run"
    cmd = [
        str(BIN / "nmt-train"),
        "experiment=quick",
        f"hydra.run.dir={run_dir}",
        f"paths.data_dir={root / 'data'}",
        "trainer.progress=false",
        "data.train_size=2000",
        "trainer.max_steps=100",
        "trainer.valid_every=100",
        "trainer.threads=1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (run_dir / "checkpoints" / "best.pt").exists()
    return run_dir


@pytest.fixture(scope="session")
def torch_compiles() -> bool:
    """Whether torch.compile works on this machine (it needs a C++ compiler): the tests of the compiled
    kernels (nmt.kernels.compiled) are skipped where it does not, or fail where NMT_REQUIRE_KERNELS=1 (CI, which
    installs a compiler: .ci/run)."""
    try:
        torch.compile(lambda x: x.sigmoid() * 2, dynamic=True)(torch.randn(3))
    except Exception as e:  # no compiler, no Python headers: Inductor's errors have no common base
        if os.environ.get("NMT_REQUIRE_KERNELS") == "1":
            pytest.fail(f"NMT_REQUIRE_KERNELS=1 but torch.compile fails here ({type(e).__name__}: {str(e)[:200]})")
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


class CountedKernels(dict):
    """nmt.kernels.compiled's cache of built kernels whose every entry counts its calls, by the C++ source's
    file name (hand-written kernels) or the compiled function's name (torch.compile's): `calls`."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    def __setitem__(self, key, fn):
        name = key[0].name if isinstance(key, tuple) else getattr(key, "__name__", str(key))

        def counted(*args):
            self.calls[name] += 1
            return fn(*args)

        super().__setitem__(key, counted)


@pytest.fixture
def kernel_calls(monkeypatch) -> Counter:
    """The calls of every kernel built or loaded during the test (an empty cache first: libraries built before
    load again from disk in milliseconds), by source file name: a kernel's test asserts that the kernel ran."""
    from nmt.kernels import compiled as compiled_module

    cache = CountedKernels()
    monkeypatch.setattr(compiled_module, "_cache", cache)
    return cache.calls


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
