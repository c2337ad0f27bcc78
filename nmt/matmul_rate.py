"""The yardstick the benchmarks divide their achieved FLOP rates by: a sustained square matmul's rate."""

from __future__ import annotations


def matmul_rate(threads: int, seconds: float, n: int = 512, dtype=None, device: str = "cpu") -> dict:
    """Sustained GFLOP/s of an n x n x n torch.mm in `dtype` (default fp32; 2 n^3 FLOPs per call) at `threads`
    threads on `device`: the yardstick the benchmarks divide their achieved FLOP rates by. On a GPU the device
    is synchronised before the clock is read (use n=4096 there: a 512^3 product leaves most of a GPU idle)."""
    import time

    import torch

    dtype = dtype or torch.float32
    torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a, b, out = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(3))
    for _ in range(10):
        torch.mm(a, b, out=out)
    sync()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            torch.mm(a, b, out=out)
        sync()
        calls += 10
    elapsed = time.perf_counter() - start
    return {
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": threads,
        "device": str(device),
        "calls": calls,
        "seconds": round(elapsed, 3),
        "gflops": round(2 * n**3 * calls / elapsed / 1e9, 1),
    }
