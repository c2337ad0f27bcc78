"""Dropout's keep mask from torch's random words in one C++ pass (nmt/kernels/csrc/keep_mask.cpp), for
nmt.dropout.keep_mask where the run's plan uses it (the component dropout_mask, nmt.plan).

    mask = keep_mask_from(words, n, threshold, scale)   # (n,) fp32, or None: torch's operations then

The same numbers as keep_mask's torch operations (a strided int16 copy, a compare, a cast and a scale: ~4 ns an
element on the AVX2 EPYC, against ~0.2 here; torch's generator drawing the words, ~1.5 ns an element, stays).
Little-endian machines only (the fields' order in a word), as every CPU torch ships for.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import Tensor

from nmt.kernels.compiled import cpp_kernel, fallback

SOURCE = Path(__file__).parent / "csrc" / "keep_mask.cpp"
ARGTYPES = ["uintptr_t", "int64_t", "int64_t", "float", "uintptr_t"]


def keep_mask_from(words: Tensor, n: int, threshold: int, scale: float) -> Tensor | None:
    """(n,) fp32: `scale` where field i of `words` (int64, CPU, contiguous; three int16 fields each) is >=
    `threshold`, else 0; None where the kernel does not run (kernels eager, a big-endian machine)."""
    if sys.byteorder != "little":
        return fallback("dropout_mask", "a big-endian machine")
    if words.dtype != torch.int64 or not words.is_contiguous():
        return fallback("dropout_mask", "words not contiguous int64")
    kernel = cpp_kernel(SOURCE, ARGTYPES, "dropout_mask")
    if kernel is None:
        return None
    out = torch.empty(n)
    if n:
        kernel(words.data_ptr(), n, threshold, scale, out.data_ptr())
    return out
