"""A search step's k most likely outputs and their log-probabilities in one hand-written C++ kernel.

Each step of greedy and beam search turns the output layer's logits into the log-softmax's k best entries of
every row (nmt.search). In torch operations that is the layer's addmm (which first copies its bias into the
output), a logsumexp (a max, a subtraction, an exp, a sum: a pass each over the logits) and a topk, another
pass: about a tenth of fp32 beam-5 decoding on the AVX2 EPYC measured (docs/performance.md). With this kernel
the layer is a plain matmul and `nmt/kernels/csrc/top_logprobs.cpp` does the rest row by row in two passes
while the row is in cache: the bias, the max and the running top k, then the sum of exps. It runs where the
run's plan uses it (the component beam_topk, nmt.plan; a Translator's plan for its searches); elsewhere `top_log_probs`
returns None and the caller goes the torch way.

    found = top_log_probs(h, weight, bias, k, skip)   # h (N, H) fp32 -> (values (N, k) fp32, ids (N, k) int64)

Shapes: N rows, H the layer's input size, V vocabulary, k outputs kept a row.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from nmt.kernels.compiled import address, cpp_kernel, fallback, is_in_torch_dispatch_mode

SOURCE = Path(__file__).parent / "csrc" / "top_logprobs.cpp"
ARGTYPES = [*["uintptr_t"] * 4, *["int64_t"] * 5]


def top_log_probs(
    h: Tensor, weight: Tensor, bias: Tensor | None, k: int, skip: tuple[int, int]
) -> tuple[Tensor, Tensor] | None:
    """The k largest log-softmax values of the logits h W^T + bias (V,) in each row, largest first, and their
    ids, the two ids in `skip` (padding and BOS) never among them but in the normaliser; of equal values the
    lower id first. None (nothing computed) where the kernel does not run: not a CPU, kernels not compiled,
    not fp32 (bf16 autocast included), k over V - 2, or under a torch dispatch mode (a FLOP counter)."""
    if h.device.type != "cpu" or is_in_torch_dispatch_mode() or torch.is_autocast_enabled("cpu"):
        return fallback("beam_topk", "not a CPU tensor, under autocast or under a torch dispatch mode")
    if h.dim() != 2 or any(t is not None and t.dtype != torch.float32 for t in (h, weight, bias)):
        return fallback("beam_topk", "not 2-D fp32 states and weights")
    V = weight.size(0)
    if not 1 <= k <= V - 2 or (bias is not None and not bias.is_contiguous()):
        return fallback("beam_topk", "k beyond the vocabulary less 2, or a bias not contiguous")
    kernel = cpp_kernel(SOURCE, ARGTYPES, "beam_topk")
    if kernel is None:
        return None
    z = h.mm(weight.t())  # (N, V): the layer without its bias (the kernel adds it)
    values, ids = h.new_empty(h.size(0), k), torch.empty(h.size(0), k, dtype=torch.long)
    kernel(z.data_ptr(), address(bias), values.data_ptr(), ids.data_ptr(), z.size(0), V, k, *skip)
    return values, ids
