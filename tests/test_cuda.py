"""On a CUDA GPU: training steps under the GPU's plan (nmt.device_plan) never make the host wait, compute what
the CPU computes, and train through the whole loop. Marked `cuda` and skipped, with the reason, where torch sees
no GPU (CI is CPU-only; tests/test_device_plan.py checks the plan on a CPU); scripts/gpu_check.sh runs them on a
GPU machine:

    python -m pytest -q -n 0 -m cuda tests/test_cuda.py
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_device_plan import data, short_run, trainer_of  # noqa: F401 (data: a fixture)

from nmt.data import EncodedSplit, collate
from nmt.device_plan import CPU, CUDA

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False"),
]


@pytest.fixture(scope="module")
def mixed(data):  # noqa: F811
    """`data` with sources of 5-30 pieces: sorted bucketing then mixes lengths in a batch (the packed encoder)."""
    split = data.encoded["train"]
    g = torch.Generator().manual_seed(5)
    cut = torch.randint(5, 31, (len(split),), generator=g).tolist()
    sources = [split.source(i)[:n].tolist() for i, n in enumerate(cut)]
    targets = [split.target(i).tolist() for i in range(len(split))]
    return replace(data, encoded={**data.encoded, "train": EncodedSplit(sources, targets)})


def test_training_steps_never_make_the_host_wait(mixed, tmp_path):
    """Under torch.cuda.set_sync_debug_mode("error") every synchronising call (.item(), a copy that waits, ...)
    raises: 50 bf16 steps of mixed source lengths after two warm-up steps (first-use allocations) raise none."""
    trainer = trainer_of(mixed, tmp_path, CUDA, 2000, device="cuda", amp="bf16", bucketing="sorted")
    groups = trainer._groups(0)
    for pos in range(2):
        trainer.batch_pos = pos
        trainer._train_step(groups[pos])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for pos in range(2, 52):
            trainer.batch_pos = pos % len(groups)
            loss, _, _ = trainer._train_step(groups[pos % len(groups)])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.is_tensor(loss) and loss.device.type == "cuda" and torch.isfinite(loss)


def test_a_cuda_step_computes_the_cpu_steps_loss_and_gradients(mixed, tmp_path):
    """fp32 without dropout, TF32 off: the same first step's loss and gradients on both devices."""
    allowed = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        runs = []
        for device, plan in (("cpu", CPU), ("cuda", CUDA)):
            trainer = trainer_of(mixed, tmp_path / device, plan, device=device, bucketing="sorted", dropout=0.0)
            groups = trainer._groups(0)
            loss = float(trainer._train_step(groups[0])[0])
            runs.append((loss, [p.grad.detach().cpu() for p in trainer.module.parameters()]))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = allowed
    (cpu_loss, cpu_grads), (cuda_loss, cuda_grads) = runs
    assert cuda_loss == pytest.approx(cpu_loss, rel=1e-5)
    for a, b in zip(cuda_grads, cpu_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)


def test_the_feed_pins_its_batches_and_copies_them_to_the_gpu(mixed):
    from nmt.device_batches import DeviceBatches

    split, group = mixed.encoded["train"], [list(range(0, 9)), list(range(9, 20))]
    feed = DeviceBatches(CUDA, torch.device("cuda"))
    prepared = feed._prepare(split, group)
    assert all(batch.src.is_pinned() and rows.is_pinned() for batch, rows, _ in prepared)
    assert all(layout.src_order.is_pinned() and layout.loop_positions.is_pinned() for _, _, layout in prepared)
    taken = feed.take(split, group, [[list(range(20, 30))]])
    for (batch, rows, layout), indices in zip(taken, group, strict=True):
        assert batch.src.device.type == rows.device.type == "cuda" and batch.src_lengths.device.type == "cpu"
        assert layout.src_order.device.type == layout.loop_positions.device.type == "cuda"
        assert torch.equal(batch.tgt_in.cpu(), collate(split, indices).tgt_in)


def test_a_short_run_trains_logs_and_checkpoints_on_the_gpu(mixed, tmp_path):
    short_run(trainer_of(mixed, tmp_path, CUDA, device="cuda", amp="bf16"), tmp_path)


def test_the_matmul_yardstick_runs_on_the_gpu():
    """scripts/benchmark.py divides a GPU run's FLOP rate by the GPU's own 4096^3 rate, not the CPU's."""
    from nmt.matmul_rate import matmul_rate

    rate = matmul_rate(1, 0.5, n=4096, dtype=torch.bfloat16, device="cuda")
    assert rate["device"] == "cuda" and rate["calls"] >= 10 and rate["gflops"] > 10_000  # any GPU of the plan
