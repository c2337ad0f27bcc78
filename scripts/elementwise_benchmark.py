"""python scripts/elementwise_benchmark.py [--elements N] [--threads 1 2] [--seconds S] [--out FILE]

Nanoseconds per element of the elementwise kernels the additive attention could use, on this CPU:

    python scripts/elementwise_benchmark.py
    python scripts/elementwise_benchmark.py --elements 1048576 --threads 1 2 --out tanh.json

For each thread count and dtype (fp32, bf16) it times, in place on a buffer of --elements values (the default,
2^18 fp32 values, is one of nmt.kernels.energy's 1 MiB pieces):
    tanh_              torch's tanh
    sigmoid form       x.mul_(2).sigmoid_().mul_(2).sub_(1): tanh(x) = 2 sigmoid(2x) - 1 in full (nmt.kernels.energy
                       computes sigmoid(2x) and folds the rest into its reductions, so it pays less than this)
    sigmoid_           torch's sigmoid alone
    exp_               torch's exp
    add                x + y into a third buffer (a plain memory-bound pass, for scale)
and the largest difference of each fp32 form from fp64 tanh over standard normal values.
nmt.kernels.energy uses the sigmoid because torch's CPU fp32 tanh kernel was about 7x slower than the whole sigmoid
form on the one machine measured so far, the AMD EPYC (docs/performance.md, "Long inputs"); run this to see whether that
holds on yours.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import nmt.cli  # noqa: F401  (the commands' malloc and memory settings: must come before torch)

# isort: split
import torch

from nmt.provenance import describe_machine


def per_element(fn, elements: int, seconds: float = 0.5) -> float:
    """Nanoseconds per element of fn(), timed for about `seconds` after a warm-up."""
    for _ in range(10):
        fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            fn()
        calls += 20
    return (time.perf_counter() - start) / calls / elements * 1e9


def kernels(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> dict:
    return {
        "copy": lambda: out.copy_(x),
        "tanh_": lambda: out.copy_(x).tanh_(),
        "sigmoid form": lambda: out.copy_(x).mul_(2).sigmoid_().mul_(2).sub_(1),
        "sigmoid_": lambda: out.copy_(x).sigmoid_(),
        "exp_": lambda: out.copy_(x).exp_(),
        "add": lambda: torch.add(x, y, out=out),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--elements", type=int, default=1 << 18, help="buffer size in elements (default 2^18)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts (default 1 2)")
    p.add_argument("--seconds", type=float, default=0.5, help="seconds timed per kernel (default 0.5)")
    p.add_argument("--out", help="also write the results as JSON to this file")
    args = p.parse_args()
    if args.elements < 1 or min(args.threads) < 1 or args.seconds <= 0:
        p.error("--elements and --threads must be at least 1, --seconds above 0")

    g = torch.Generator().manual_seed(0)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.bfloat16):
            x, y = (torch.randn(args.elements, generator=g).to(dtype) for _ in range(2))
            out = torch.empty_like(x)
            table = kernels(x, y, out)
            # every in-place kernel copies x into out first: that copy's time is subtracted
            copy = per_element(table.pop("copy"), args.elements, args.seconds)
            for name, fn in table.items():
                ns = per_element(fn, args.elements, args.seconds)
                ns = ns if name == "add" else max(ns - copy, 0.0)
                rows.append({"threads": threads, "dtype": str(dtype).removeprefix("torch."), "kernel": name, "ns": ns})
    z = torch.randn(args.elements, generator=g)  # fp32
    exact = torch.tanh(z.double())
    error = {
        "sigmoid form": float((z.mul(2).sigmoid_().mul_(2).sub_(1).double() - exact).abs().max()),
        "tanh_": float((torch.tanh(z).double() - exact).abs().max()),
    }

    print(f"{'threads':>7}  {'dtype':<9} {'kernel':<13} {'ns/element':>10}")
    for r in rows:
        print(f"{r['threads']:>7}  {r['dtype']:<9} {r['kernel']:<13} {r['ns']:>10.3f}")
    print(
        f"fp32 against fp64 tanh, max |difference| over {args.elements} values: sigmoid form "
        f"{error['sigmoid form']:.1e}, tanh_ {error['tanh_']:.1e}"
    )
    if args.out:
        machine = describe_machine(max(args.threads))
        result = {
            "command": "python " + " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elements": args.elements,
            "machine": machine,
            "results": rows,
            "max_abs_error": error,
        }
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
