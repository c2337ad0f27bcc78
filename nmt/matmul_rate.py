"""The yardstick the benchmarks divide their achieved FLOP rates by: a sustained square matmul's rate."""

from __future__ import annotations


def matmul_rate(threads: int, seconds: float, n: int = 512, dtype=None) -> dict:
    """Sustained GFLOP/s of an n x n x n torch.mm in `dtype` (default fp32; 2 n^3 FLOPs per call) at `threads`
    threads: the yardstick the benchmarks divide their achieved FLOP rates by."""
    import time

    import torch

    dtype = dtype or torch.float32
    torch.set_num_threads(threads)
    a, b, out = (torch.randn(n, n, dtype=dtype) for _ in range(3))
    for _ in range(10):
        torch.mm(a, b, out=out)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            torch.mm(a, b, out=out)
        calls += 10
    elapsed = time.perf_counter() - start
    return {
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": threads,
        "calls": calls,
        "seconds": round(elapsed, 3),
        "gflops": round(2 * n**3 * calls / elapsed / 1e9, 1),
    }
