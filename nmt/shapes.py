"""Row counts rounded up, so that the matmuls of differently sized batches share a few shapes.

On a CPU with bf16 hardware every matmul shape is a oneDNN kernel, compiled for its exact (rows, inner,
columns) and kept in a cache (nmt/memory.py): about 330 KiB of heap each on the machine measured. A batch of
B sentences of S source (or T target) pieces brings its own B x S (B x T) row count to every matmul over all
positions at once (the attention's key projection, the decoder's input projection, the weight gradients
summed over steps): one epoch of the multi30k_deen preset met about 100 source and 42 target row counts.
Rounded up to a multiple of ROW_MULTIPLE with zero rows they were 20 and 11; the zero rows add at most
ROW_MULTIPLE - 1 rows of arithmetic (3% at 2,000 rows) and change no result.

    keys = linear_rows(states, self.key_proj.weight, self.key_proj.bias)   # (B, S, D) -> (B, S, A)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

ROW_MULTIPLE = 64  # rows rounded up to a multiple of this (nmt.loss.loss_rows rounds its rows alike)


def padded_count(n: int, multiple: int = ROW_MULTIPLE) -> int:
    """n rounded up to a multiple of `multiple` (0 stays 0)."""
    return -(-n // multiple) * multiple


def pad_rows(x: Tensor, multiple: int = ROW_MULTIPLE) -> Tensor:
    """x (N, C) with zero rows appended up to a multiple of `multiple` rows: (padded_count(N), C)."""
    extra = padded_count(x.size(0), multiple) - x.size(0)
    return x if extra == 0 else torch.cat([x, x.new_zeros(extra, x.size(1))])


def cat_rows(xs: list[Tensor], multiple: int = ROW_MULTIPLE) -> Tensor:
    """pad_rows(torch.cat(xs), multiple) in one copy: the rows of xs (each (n_i, C), one dtype) one after another
    in a buffer of padded_count(sum n_i) rows, the rest zero. (pad_rows after torch.cat copies everything twice.)"""
    n = sum(x.size(0) for x in xs)
    if any(x.dtype != xs[0].dtype for x in xs):
        return pad_rows(torch.cat(xs), multiple)  # torch.cat's type promotion
    out = xs[0].new_empty(padded_count(n, multiple), xs[0].size(1))
    torch.cat(xs, out=out[:n])
    out[n:].zero_()
    return out


def linear_rows(x: Tensor, weight: Tensor, bias: Tensor | None = None, multiple: int = ROW_MULTIPLE) -> Tensor:
    """F.linear(x, weight, bias), (..., in) -> (..., out), computed over x's rows padded with zero rows to a
    multiple of `multiple` (the same values; the matmul's shape, forward and backward, one of a few)."""
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.size(-1))  # (N, in)
    out = F.linear(pad_rows(flat, multiple), weight, bias)  # (N', out)
    return out[: flat.size(0)].view(*lead, out.size(-1))
