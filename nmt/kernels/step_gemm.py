"""A decoder step's fp32 products through weights packed once per batch, in a hand-written C++ kernel.

A teacher-forced decoder multiplies about a hundred rows by the same weights at every step, forward (x W^T)
and backward (g W). A general matmul (MKL's, under torch.mm) copies the weight into its own blocked layout at
every call, and over so few rows that copy is a large part of the call: on the AVX2 EPYC measured, 110 rows by
the recurrence's (2048, 1024) weight ran at about two thirds of a large product's rate. `pack` lays W out once
per batch in panels of 2 vectors of columns, for both directions; `product` then reads the panels straight
from the cache (`nmt/kernels/csrc/step_gemm.cpp`). It runs where the run's plan uses it
(the component step_products, nmt.plan), on a CPU, in fp32; elsewhere `pack` returns None and the steps call
F.linear and mm (nmt.kernels.stepweight). The sums are the same products in another order. The encoder's
LSTM (nmt.kernels.encoder_lstm) packs W_hh for each direction, forward and backward apart. The fused output
layer (nmt.loss.output_loss_sum) packs its (V, H) weight once per batch for the forward only (`backward=False`)
and makes each piece's logits from it, where torch.mm laid the 16 MB weight out again for every piece.

    panels = pack(weight)                             # W (out, in) fp32 -> Panels, or None
    y = product(x, panels.forward, out, panels.kernel)      # x (n, in) W^T -> (n, out)
    g_x = product(g, panels.backward, in_, panels.kernel)   # g (n, out) W -> (n, in)

Shapes: n rows, K the inner size, N the output's columns, NR a panel's columns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from nmt.kernels.compiled import cpp_kernel, fallback

SOURCE = Path(__file__).parent / "csrc" / "step_gemm.cpp"
ARGTYPES = ["int64_t", *["uintptr_t"] * 3, *["int64_t"] * 5]
PACK, PRODUCT, WIDTH = 0, 1, 2  # the kernel's first argument


class Panels(NamedTuple):
    """W (out, in) packed twice: `forward` for x W^T (K = in, N = out), `backward` for g W (K = out, N = in);
    either None where not asked for; `kernel`, the built kernel that packed them and multiplies by them."""

    forward: Tensor | None
    backward: Tensor | None
    kernel: Callable


def pack(
    weight: Tensor, backward: bool = True, forward: bool = True, component: str = "step_products"
) -> Panels | None:
    """W's panels for both directions (or one), or None where the kernel does not run (not a CPU, not fp32,
    `component`'s kernel not in use: the step's products, or the encoder's or the output layer's own packing)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
        return fallback(component, "a weight that is not a 2-D fp32 CPU tensor")
    kernel = cpp_kernel(SOURCE, ARGTYPES, component)
    if kernel is None:
        return None
    w = weight.detach().contiguous()
    out, in_ = w.shape
    return Panels(
        _pack(kernel, w, in_, out, 1, in_) if forward else None,
        _pack(kernel, w, out, in_, in_, 1) if backward else None,
        kernel,
    )


def _pack(kernel: Callable, w: Tensor, K: int, N: int, sk: int, sj: int) -> Tensor:
    """B (K, N), its element (k, j) at w[k * sk + j * sj], in panels: (ceil(N / NR) * K * NR,) floats."""
    nr = _width(kernel)
    panels = w.new_empty(-(-N // nr) * K * nr)
    kernel(PACK, w.data_ptr(), panels.data_ptr(), 0, sk, sj, 0, K, N)
    return panels


def product(x: Tensor, panels: Tensor, N: int, kernel: Callable, out: Tensor | None = None) -> Tensor:
    """x (n, K) fp32 times the packed B (K, N) -> (n, N), by the kernel that packed it (Panels.kernel); into
    `out` (n, N) where given, whose rows may be apart (its last dimension contiguous)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    n, K = x.shape
    out = x.new_empty(n, N) if out is None else out
    if n:
        kernel(PRODUCT, x.data_ptr(), panels.data_ptr(), out.data_ptr(), x.stride(0), out.stride(0), n, K, N)
    return out


_widths: dict[Callable, int] = {}


def width(component: str = "step_products") -> int | None:
    """NR of the kernel `pack` uses for `component` (None where it does not run)."""
    kernel = cpp_kernel(SOURCE, ARGTYPES, component)
    return None if kernel is None else _width(kernel)


def _width(kernel: Callable) -> int:
    """NR, the panels' columns: 2 vectors of the ISA the kernel was built for (16 floats on AVX2)."""
    if kernel not in _widths:
        nr = torch.zeros(1, dtype=torch.long)
        kernel(WIDTH, nr.data_ptr(), 0, 0, 0, 0, 0, 0, 0)
        _widths[kernel] = int(nr)
    return _widths[kernel]
