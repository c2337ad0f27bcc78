"""Weights used at every step of a loop, with their gradient computed once over all steps.

Autograd forms one full weight gradient per use and adds them up: for a decoder step x_t W^T that is a
(out, in) matmul and a (out, in) addition per step. The sum over steps, sum_t g_t^T x_t, is G^T X over the
stacked steps: one matmul. `StepWeight.of(weight)` hands the weight to the loop through _SharedWeight,
each step's product goes through _StepLinear (input gradient only; it records (x_t, g_t)), and
_SharedWeight's backward, which autograd runs after every step's, does the one matmul.

    w = StepWeight.of(self.combine.weight, dtype)   # once per batch (cast once under autocast)
    for t in ...:
        y_t = w(x_t)                                 # x_t W^T
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class _Steps:
    """The (input, output gradient) pairs of one weight's per-step uses, filled during backward."""

    def __init__(self):
        self.inputs: list[Tensor] = []
        self.grads: list[Tensor] = []


class _SharedWeight(torch.autograd.Function):
    """Hands a weight to every step of the decoder loop and computes its gradient once, as one matmul.

    Autograd would otherwise form and add up one full weight gradient per step (a (4H, 2H) matmul and
    add per step); sum_t g_t^T x_t = G^T X over the stacked steps is the same sum, in one call.
    """

    @staticmethod
    def forward(ctx, weight: Tensor, steps: _Steps) -> Tensor:
        ctx.steps = steps
        ctx.set_materialize_grads(False)
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor | None):
        steps = ctx.steps
        if steps.grads:
            total = torch.cat(steps.grads).t().mm(torch.cat(steps.inputs))  # (out, in)
            grad = total if grad is None else grad + total
            steps.inputs.clear()
            steps.grads.clear()
        return grad, None


class _StepLinear(torch.autograd.Function):
    """x W^T for one step; its weight gradient is left to _SharedWeight (only the input gradient here)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, steps: _Steps) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.steps = steps
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        ctx.steps.inputs.append(x)
        ctx.steps.grads.append(grad)
        return (grad.mm(weight) if ctx.needs_input_grad[0] else None), None, None


class StepWeight(NamedTuple):
    """A weight used at every decoder step (see _SharedWeight); plain F.linear when no gradient is needed."""

    weight: Tensor
    steps: _Steps | None

    @classmethod
    def of(cls, weight: Tensor, dtype: torch.dtype | None) -> StepWeight:
        weight = weight if dtype is None else weight.to(dtype)
        if not (torch.is_grad_enabled() and weight.requires_grad):
            return cls(weight, None)
        steps = _Steps()
        return cls(_SharedWeight.apply(weight, steps), steps)

    def __call__(self, x: Tensor) -> Tensor:
        x = x.to(self.weight.dtype)
        if self.steps is None:
            return F.linear(x, self.weight)
        return _StepLinear.apply(x, self.weight, self.steps)
