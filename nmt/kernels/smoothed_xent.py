"""The label-smoothed cross-entropy of a piece of logits and its gradient in one hand-written C++ kernel.

fp32 training on a CPU runs the output layer inside the loss (nmt.loss.output_loss_sum), a piece of rows at a time:
each piece's logits become their loss and, in place, their gradient. In torch operations that is a logsumexp
(a max, a subtraction, an exp, a sum and a log, each a pass over the piece), a gather, a mean, another exp, a
subtraction, a scatter and a multiplication: about ten passes and two exps per logit.
`nmt/kernels/csrc/smoothed_xent.cpp` does it row by row in three passes with one exp per logit, while the row
is in cache. It runs where the run's plan uses it (the component output_loss, nmt.plan); elsewhere
`smoothed_xent` returns False and the caller goes the torch way.

    done = smoothed_xent(z, bias, target, losses, eps, pad, grad_bias)  # z = x W^T (R, V) fp32 -> z + bias's gradient

Shapes: R rows, V vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from nmt.kernels.compiled import cpp_kernel, fallback, is_in_torch_dispatch_mode

SOURCE = Path(__file__).parent / "csrc" / "smoothed_xent.cpp"
ARGTYPES = ["uintptr_t", "uintptr_t", "uintptr_t", "uintptr_t", "int64_t", "int64_t", "float", "int64_t", "uintptr_t"]


def smoothed_xent(
    z: Tensor, bias: Tensor, target: Tensor, losses: Tensor, eps: float, pad: int, grad_bias: Tensor | None = None
) -> bool:
    """Each row of z (R, V) fp32, the output layer's products without its bias (V,) fp32, replaced by the
    gradient of the label-smoothed cross-entropy of the logits z + bias, softmax - eps / V - (1 - eps)
    onehot(target), and the loss itself written to losses (R,) fp32; rows whose target (R,) int64 is `pad` get
    zeros in both. With grad_bias (V,) fp32, the gradient's column sums (the bias's gradient) are added into
    it. False (nothing done, z untouched) where the kernel does not run: not a CPU, kernels not compiled, other
    dtypes or layouts, or under a torch dispatch mode (a FLOP counter)."""
    if z.device.type != "cpu":
        return bool(fallback("output_loss", "not a CPU tensor"))
    if is_in_torch_dispatch_mode():
        return bool(fallback("output_loss", "under a torch dispatch mode (a FLOP counter)"))
    sums = [] if grad_bias is None else [grad_bias]
    if any(t.dtype != torch.float32 for t in (z, bias, losses, *sums)) or target.dtype != torch.int64:
        return bool(fallback("output_loss", "not fp32 logits with int64 targets"))
    if not all(t.is_contiguous() for t in (z, bias, target, losses, *sums)):
        return bool(fallback("output_loss", "tensors not contiguous"))
    kernel = cpp_kernel(SOURCE, ARGTYPES, "output_loss")
    if kernel is None:
        return False
    R, V = z.shape
    sums_at = 0 if grad_bias is None else grad_bias.data_ptr()
    kernel(z.data_ptr(), bias.data_ptr(), target.data_ptr(), losses.data_ptr(), R, V, float(eps), int(pad), sums_at)
    return True
