"""DDP on CPU (gloo): two torchrun processes against one, DDP resume, launcher presets, the sampler's shards.

The torchrun commands here are the ones docs/distributed.md gives for CPU runs.
Each run is a few steps of the `quick` preset on a small corpus with one thread per process, so the file
stays within about a minute and a half on two cores.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.checkpoint import load_checkpoint
from nmt.sampler import TokenBatchSampler

BIN = Path(sys.executable).parent
TORCHRUN = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", "-m", "nmt.cli.train"]
SINGLE = [sys.executable, "-m", "nmt.cli.train"]
SMALL = [
    "experiment=quick",
    "data.train_size=1500",
    "data.valid_size=60",
    "data.test_size=60",
    "trainer.progress=false",
    "trainer.log_every=1",
    "trainer.heatmaps=1",
    "trainer.threads=1",
]
# Without dropout one process and two compute the same thing (with it, each draws its own masks); 30 steps
# is where BLEU leaves zero, so the comparison means something.
# fp32 (amp=off): under bf16 autocast the rounding depends on how the batch is split between the ranks
NO_DROPOUT = ["model.dropout=0", "trainer.max_steps=30", "trainer.valid_every=15", "trainer.amp=off"]
# The same sums in a different order: one process adds all sentences' gradients in one backward pass,
# gloo adds two half-batch sums, and Adam divides by sqrt(v), which magnifies the last-bit differences of
# tiny gradients. Measured after 30 steps: max |difference| 3.2e-6; allowed: 15 times that, still
# far below one step's update (lr 3e-3).
WEIGHT_TOL = {"rtol": 1e-4, "atol": 5e-5}


def run(cmd: list[str], cwd: Path, data_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd + SMALL + [f"paths.data_dir={data_dir}", *overrides], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def history(ckpt: Path, kind: str) -> list[dict]:
    return [h for h in load_checkpoint(ckpt)["history"] if h["kind"] == kind]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, data_dir) -> Path:
    """Two processes, default run directory (outputs/<date>/<time> under the working directory)."""
    root = tmp_path_factory.mktemp("ddp")
    run(TORCHRUN, root, data_dir, *NO_DROPOUT)
    dirs = [p for p in (root / "outputs").glob("*/*") if p.is_dir()]
    assert len(dirs) == 1, dirs  # one run directory, however far apart the ranks resolved ${now:...}
    return dirs[0]


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, data_dir) -> Path:
    run_dir = tmp_path_factory.mktemp("single") / "run"
    run(SINGLE, run_dir.parent, data_dir, *NO_DROPOUT, f"hydra.run.dir={run_dir}")
    return run_dir


def test_two_processes_finish_and_rank0_writes_one_of_everything(ddp_run):
    assert sorted(p.name for p in (ddp_run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    assert len(list((ddp_run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert [p.name for p in ddp_run.glob("*.log")] == ["train.log"]
    log = (ddp_run / "train.log").read_text()
    assert "2 processes" in log and log.count("validation at step 30") == 1
    data = load_checkpoint(ddp_run / "checkpoints" / "last.pt")
    assert data["step"] == 30 and data["world_size"] == 2


def test_validation_matches_a_single_process_with_the_same_total_batch(ddp_run, single_run):
    ddp = history(ddp_run / "checkpoints" / "last.pt", "valid")
    one = history(single_run / "checkpoints" / "last.pt", "valid")
    assert [h["step"] for h in ddp] == [h["step"] for h in one] == [15, 30]
    assert one[-1]["bleu"] > 0
    for a, b in zip(ddp, one, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
        assert (a["bleu"], a["chrf"]) == (b["bleu"], b["chrf"])  # greedy decoding: the same sentences
    train_a = history(ddp_run / "checkpoints" / "last.pt", "train")
    train_b = history(single_run / "checkpoints" / "last.pt", "train")
    assert [h["loss"] for h in train_a] == pytest.approx([h["loss"] for h in train_b], abs=1e-4)


def test_final_weights_match_a_single_process(ddp_run, single_run):
    a = load_checkpoint(ddp_run / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(single_run / "checkpoints" / "last.pt")["model"]
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], **WEIGHT_TOL, msg=lambda m, k=k: f"{k}: {m}")


def test_ddp_resume_continues_the_same_run(tmp_path, data_dir):
    """Stop two processes at step 4, rerun to 8 in the same directory: the same losses as going straight to 8.

    Dropout stays on, so each rank's random state has to come back. The interrupted run also lets every rank
    resolve its own run directory (as `${now:...}` may, a second apart); rank 0's is the one all of them use.
    """
    straight = tmp_path / "straight"
    run(TORCHRUN, tmp_path, data_dir, "trainer.max_steps=8", "trainer.valid_every=4", f"hydra.run.dir={straight}")
    resumed = tmp_path / "resumed"
    per_rank_dir = f"hydra.run.dir={resumed}/rank${{oc.env:RANK}}"
    run(TORCHRUN, tmp_path, data_dir, "trainer.max_steps=4", "trainer.valid_every=4", per_rank_dir)
    proc = run(TORCHRUN, tmp_path, data_dir, "trainer.max_steps=8", "trainer.valid_every=4", per_rank_dir)
    assert sorted(p.name for p in resumed.iterdir()) == ["rank0"]
    assert "resuming from" in proc.stdout + proc.stderr
    a, b = resumed / "rank0" / "checkpoints" / "last.pt", straight / "checkpoints" / "last.pt"
    assert [h["loss"] for h in history(a, "train")] == [h["loss"] for h in history(b, "train")]
    assert len(history(a, "train")) == 8
    wa, wb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------------------------------- launchers


def _installed(module: str) -> bool:
    """find_spec raises (rather than returning None) when the parent package, hydra_plugins, is missing."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize(
    "preset, plugin, launcher",
    [
        (None, None, "hydra_plugins.nmt_launcher.NMTLauncher"),  # Hydra's basic launcher, claiming each job first
        ("local_parallel", "hydra_joblib_launcher", "joblib_launcher.JoblibLauncher"),
        ("slurm", "hydra_submitit_launcher", "submitit_launcher.SlurmLauncher"),
    ],
)
def test_launcher_presets_compose(tmp_path, preset, plugin, launcher):
    """Without launcher=... the config composes with no plugin installed; a preset picks its plugin."""
    if plugin and not _installed(f"hydra_plugins.{plugin}"):
        pytest.skip(f"{plugin} not installed (pip install -e '.[cluster]')")
    chosen = [f"launcher={preset}"] if preset else []
    cmd = [str(BIN / "nmt-train"), "--cfg", "hydra", "experiment=quick", *chosen]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    target = launcher if plugin is None else f"hydra_plugins.{plugin}.{launcher}"
    assert f"_target_: {target}\n" in proc.stdout


# ------------------------------------------------------------------------------------- sampler sharding


def _lengths(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 40, (n,), generator=g), torch.randint(2, 40, (n,), generator=g)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_global_batch_is_dealt_out_whole_and_evenly(world):
    src, tgt = _lengths(700, seed=world)
    ranks = [TokenBatchSampler(src, tgt, 500, seed=11, rank=r, world_size=world) for r in range(world)]
    for epoch in range(4):
        glob = ranks[0].global_batches(epoch)
        assert all(s.global_batches(epoch) == glob for s in ranks[1:])  # the ranks agree on the global order
        shards = [s.batches(epoch) for s in ranks]
        assert {len(s) for s in shards} == {len(glob)} and len(glob) == len(ranks[0])  # same step count
        for i, batch in enumerate(glob):
            parts = [shard[i] for shard in shards]
            assert sorted(j for p in parts for j in p) == sorted(batch)  # the union is the global batch
            assert len({j for p in parts for j in p}) == len(batch)  # and no sentence is dealt twice
            assert max(map(len, parts)) - min(map(len, parts)) <= 1 and min(map(len, parts)) >= 1
        assert sorted(j for b in glob for j in b) == list(range(700))  # each sentence once per epoch
    assert ranks[0].batches(0) != ranks[0].batches(1)  # a new order every epoch


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=4, max_size=300),
    batch_tokens=st.integers(1, 400),
    world=st.integers(2, 4),
    epoch=st.integers(0, 5),
)
def test_shards_are_disjoint_and_complete_for_any_lengths(lengths, batch_tokens, world, epoch):
    src = torch.tensor(lengths)
    samplers = [
        TokenBatchSampler(src, src.flip(0), batch_tokens, seed=3, rank=r, world_size=world) for r in range(world)
    ]
    shards = [s.batches(epoch) for s in samplers]
    assert len({len(s) for s in shards}) == 1
    if len(lengths) >= world:  # a rank never gets an empty batch (it would have nothing to backpropagate)
        assert all(b for s in shards for b in s)
    seen = [j for s in shards for b in s for j in b]
    assert sorted(seen) == list(range(len(lengths)))
