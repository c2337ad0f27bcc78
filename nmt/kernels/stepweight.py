"""Weights (and batches of matrices) used at every step of a loop, with their gradient computed once over all steps.

Autograd forms one full weight gradient per use and adds them up: for a decoder step x_t W^T that is a
(out, in) matmul and a (out, in) addition per step. The sum over steps, sum_t g_t^T x_t, is G^T X over the
stacked steps: one matmul. `StepWeight.of(weight)` hands the weight to the loop through `share`,
each step's product goes through _StepLinear (input gradient only; it records (x_t, g_t)), and
the shared tensor's backward, which autograd runs after every step's, does the one matmul.

    w = StepWeight.of(self.combine.weight, dtype)   # once per batch (cast once under autocast)
    for t in ...:
        y_t = w(x_t)                                 # x_t W^T

Where the run's plan uses step_products (nmt.plan) on a CPU, the weight is also packed once per batch for the
steps' products: an fp32 weight in panels for a hand-written kernel (nmt.kernels.step_gemm), a bf16 weight on a
CPU with bf16 hardware in oneDNN's layout (`Packed`).

The attention's values (and the keys of the matmul scores) are the same for a batch of matrices, one per
sentence: `StepMatrix.of(values, dtype)` hands them to the steps, each step's a_t M records (a_t, g_t), and the
gradient is one bmm over the stacked steps, A^T G, instead of one (B, S, D) outer product and addition per step.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.kernels import step_gemm
from nmt.kernels.compiled import enabled, fallback, is_in_torch_dispatch_mode
from nmt.kernels.step_gemm import Panels
from nmt.precision import native_bf16
from nmt.shapes import cat_rows, padded_count


class _Shared(torch.autograd.Function):
    """Hands a tensor to every step of a loop whose steps record what its gradient needs; the backward, which
    autograd runs after every step's, adds `total()` (that gradient formed at once, or None) to the rest."""

    @staticmethod
    def forward(ctx, tensor: Tensor, total: Callable[[], Tensor | None]) -> Tensor:
        ctx.total = total
        ctx.set_materialize_grads(False)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: Tensor | None):
        total = ctx.total()
        if total is not None:
            grad = total if grad is None else grad + total
        return grad, None


def share(tensor: Tensor, total: Callable[[], Tensor | None]) -> Tensor:
    """`tensor` for the steps of a loop (an alias), whose gradient from those steps is `total()`, called once
    after every step's backward (nmt.kernels.energy.StepKeys uses it too)."""
    return _Shared.apply(tensor, total)


class _Steps:
    """The (input, output gradient) pairs of one weight's per-step uses, filled during backward."""

    def __init__(self):
        self.inputs: list[Tensor] = []
        self.grads: list[Tensor] = []

    def _take(self) -> tuple[list[Tensor], list[Tensor]]:
        inputs, grads = self.inputs, self.grads
        self.inputs, self.grads = [], []
        return inputs, grads

    def weight_gradient(self) -> Tensor | None:
        """sum_t g_t^T x_t = G^T X over the stacked steps (out, in): one matmul, where autograd would form and
        add up one full weight gradient per step (a (4H, 2H) matmul and addition per step)."""
        if not self.grads:
            return None
        inputs, grads = self._take()
        return _stacked(grads).t().mm(_stacked(inputs))  # zero rows: nmt.shapes

    def matrix_gradient(self, transpose: bool, batch: int) -> Tensor | None:
        """y_t = a_t M: dM = A^T G (B, X, Y); y_t = a_t M^T: dM = G^T A (B, Y, X); one bmm over the steps.
        A step that multiplied the matrices of the first b < B sentences only (StepMatrix.rows) counts zero
        for the others. A record may hold several steps, (B, T', X) (a loop that made them at once)."""
        if not self.grads:
            return None
        inputs, grads = self._take()
        a, g = _joined(_full(inputs, batch)), _joined(_full(grads, batch))  # (B, T, X), (B, T, Y)
        return torch.bmm(g.transpose(1, 2), a) if transpose else torch.bmm(a.transpose(1, 2), g)


def _stacked(xs: list[Tensor]) -> Tensor:
    """cat_rows(xs); a single tensor whose rows are padded already (a loop that wrote every step's rows into one
    buffer: nmt.kernels.feed_loop) as it is, without the copy."""
    x = xs[0]
    if len(xs) == 1 and x.size(0) == padded_count(x.size(0)) and x.is_contiguous():
        return x
    return cat_rows(xs)


def _joined(steps: list[Tensor]) -> Tensor:
    """The records joined along the steps (B, T, X); a single one as it is."""
    return steps[0] if len(steps) == 1 else torch.cat(steps, dim=1)


def _full(steps: list[Tensor], batch: int) -> list[Tensor]:
    """Each step's (b, 1, X) with zero rows appended up to (batch, 1, X)."""
    return [x if x.size(0) == batch else F.pad(x, (0, 0, 0, 0, 0, batch - x.size(0))) for x in steps]


class Packed(NamedTuple):
    """A bf16 step weight W (out, in) in oneDNN's own layout, twice: for x W^T (forward) and g W (the input
    gradient).

    A decoder step multiplies a few dozen rows by W, and in a loop whose attention streams the keys through
    the cache W is read from memory at every step; oneDNN then also copies W into its blocked layout for each
    call. Packed once per batch (`pack`), a step reads the blocked copy only: on the AMD EPYC measured, 22 rows
    by a (1024, 512) weight took 162 instead of 210 us in bf16 (README "Long inputs"). Packed where the run's
    plan uses step_products (nmt.plan), on a CPU with bf16 hardware, in bf16; the products are the same up to
    the order of fp32 sums. An fp32 weight goes to nmt.kernels.step_gemm's panels instead, which hold no state
    between calls (oneDNN keeps a kernel for every row count an fp32 step meets: docs/performance.md)."""

    forward: Tensor
    backward: Tensor

    @staticmethod
    def pack(weight: Tensor) -> Packed | Panels | None:
        """W packed (see the class; an fp32 W in nmt.kernels.step_gemm's panels), or None where it is not (the
        step then calls F.linear and mm)."""
        if not enabled("step_products"):
            return None
        if weight.device.type != "cpu":
            return fallback("step_products", "not a CPU weight")
        if weight.dtype == torch.float32:
            return step_gemm.pack(weight)
        if not _PACKING["works"]:
            return fallback("step_products", "this torch's oneDNN refused to pack a weight")
        if weight.dtype != torch.bfloat16 or not native_bf16("cpu"):
            return fallback("step_products", "a weight neither fp32 nor bf16 on a CPU with bf16 hardware")
        try:
            w = weight.detach()
            return Packed(_reorder(w), _reorder(w.t().contiguous()))
        except (AttributeError, RuntimeError):  # a torch without oneDNN, or a layout it refuses: the plain calls
            _PACKING["works"] = False  # for the rest of the process
            return fallback("step_products", "this torch's oneDNN refused to pack a weight")

    @staticmethod
    def product(x: Tensor, packed: Tensor) -> Tensor:
        """x (N, in) W^T through a packed weight (or g (N, out) W through the packed W^T)."""
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


PACK_ROWS = 32  # the row count oneDNN packs for: a hint (a step's products take any number of rows)
_PACKING = {"works": torch.backends.mkldnn.is_available()}  # whether oneDNN packs bf16 weights here


def _reorder(weight: Tensor) -> Tensor:
    """A linear layer's weight (out, in) in oneDNN's blocked layout: torch's own op, private (Inductor packs
    with it), so a torch that moves it turns packing off."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)


def step_product(x: Tensor, weight: Tensor, packed: Packed | Panels | None) -> Tensor:
    """x W^T, through the packed W where there is one (x 2-D, fp32 for the panels, outside torch's dispatch
    modes: a FLOP counter sees F.linear), else F.linear."""
    if packed is not None and x.dim() == 2 and not is_in_torch_dispatch_mode():
        if not isinstance(packed, Panels):
            return Packed.product(x, packed.forward)
        if x.dtype == torch.float32:
            return step_gemm.product(x, packed.forward, weight.size(0), packed.kernel)
    return F.linear(x, weight)


def step_input_gradient(grad: Tensor, weight: Tensor, packed: Packed | Panels | None) -> Tensor:
    """g W (x W^T's input gradient), through the packed W^T where there is one and g is in W's dtype."""
    if packed is not None and grad.dtype == weight.dtype and not is_in_torch_dispatch_mode():
        if isinstance(packed, Panels):
            return step_gemm.product(grad, packed.backward, weight.size(1), packed.kernel)
        return Packed.product(grad, packed.backward)
    return grad.mm(weight)


class _StepLinear(torch.autograd.Function):
    """x W^T for one step; its weight gradient is left to _Steps.weight_gradient (only the input gradient here)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, steps: _Steps, packed: Packed | Panels | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.steps, ctx.packed = steps, packed
        return step_product(x, weight, packed)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        ctx.steps.inputs.append(x)
        ctx.steps.grads.append(grad)
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return step_input_gradient(grad, weight, ctx.packed), None, None, None


class StepWeight(NamedTuple):
    """A weight used at every decoder step (see _Steps.weight_gradient), packed for the steps' products where
    that runs (Packed); plain F.linear when no gradient is needed."""

    weight: Tensor
    steps: _Steps | None
    packed: Packed | Panels | None = None

    @classmethod
    def of(cls, weight: Tensor, dtype: torch.dtype | None) -> StepWeight:
        weight = weight if dtype is None else weight.to(dtype)
        if not (torch.is_grad_enabled() and weight.requires_grad):
            return cls(weight, None)
        steps = _Steps()
        return cls(share(weight, steps.weight_gradient), steps, Packed.pack(weight))

    def __call__(self, x: Tensor) -> Tensor:
        x = x.to(self.weight.dtype)
        if self.steps is None:
            return F.linear(x, self.weight)
        return _StepLinear.apply(x, self.weight, self.steps, self.packed)


class _StepBmm(torch.autograd.Function):
    """a_t M (or a_t M^T) for one step; M's gradient is left to _Steps.matrix_gradient (only a_t's here)."""

    @staticmethod
    def forward(ctx, a: Tensor, matrix: Tensor, steps: _Steps, transpose: bool) -> Tensor:
        ctx.save_for_backward(a, matrix)
        ctx.steps, ctx.transpose = steps, transpose
        with torch.autocast(a.device.type, enabled=False):  # the operands already share StepMatrix's dtype
            return torch.bmm(a, matrix.transpose(1, 2) if transpose else matrix)

    @staticmethod
    def backward(ctx, grad: Tensor):
        a, matrix = ctx.saved_tensors
        ctx.steps.inputs.append(a)
        ctx.steps.grads.append(grad)
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return torch.bmm(grad, matrix if ctx.transpose else matrix.transpose(1, 2)), None, None, None


class StepMatrix(NamedTuple):
    """A batch of matrices (B, X, Y) multiplied at every decoder step, a_t M, or a_t M^T with `transpose`:
    the attention's values (context = weights x values) and, for the matmul scores, its keys."""

    matrix: Tensor
    steps: _Steps
    transpose: bool

    @classmethod
    def of(cls, matrix: Tensor, dtype: torch.dtype | None, transpose: bool = False) -> Tensor | StepMatrix:
        """`matrix` for the steps of one batch (cast once to `dtype`: nmt.device.step_dtype); the plain tensor when no
        gradient is needed."""
        matrix = (matrix if dtype is None else matrix.to(dtype)).contiguous()  # once: each step reads it
        if not (torch.is_grad_enabled() and matrix.requires_grad):
            return matrix
        steps = _Steps()
        return cls(share(matrix, partial(steps.matrix_gradient, transpose, matrix.size(0))), steps, transpose)

    def rows(self, n: int) -> StepMatrix:
        """The matrices of the first n sentences (a view), their gradient summed with the others'."""
        return self if n == self.matrix.size(0) else StepMatrix(self.matrix[:n], self.steps, self.transpose)

    def __call__(self, a: Tensor) -> Tensor:
        return _StepBmm.apply(a.to(self.matrix.dtype), self.matrix, self.steps, self.transpose)


def bmm(a: Tensor, matrix: Tensor | StepMatrix, transpose: bool = False) -> Tensor:
    """a M, or a M^T with `transpose`: (B, T, X) x (B, X, Y) -> (B, T, Y), through StepMatrix when M is one;
    computed in M's dtype with autocast off."""
    if isinstance(matrix, StepMatrix):
        if matrix.transpose != transpose:
            raise ValueError("a StepMatrix is multiplied the way it was made for (transpose or not)")
        return matrix(a)
    with torch.autocast(a.device.type, enabled=False):  # in M's dtype (nmt.device.step_dtype), cast once
        return torch.bmm(a.to(matrix.dtype), matrix.transpose(1, 2) if transpose else matrix)
