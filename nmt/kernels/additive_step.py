"""One decoder step of the additive attention in two hand-written C++ kernels, forward and backward.

RNNsearch's query is the previous decoder state, so its decoder loop attends once per target step. In torch
operations a step is a dozen calls forward (the energy's kernel, the mask, the softmax, a cast, a bmm with
the values, ...) and as many backward, each with its own dispatch and autograd bookkeeping and its own pass
over memory; windows of several verses take about three decoder steps for every one of single verses for the
same number of target tokens (README "Long inputs"), so that cost per step is what keeps them slower.
`nmt/kernels/csrc/additive_step.cpp` does a step's forward in one call, row by row: the scores v^T tanh(q + k_s) from
sigmoids (as nmt.kernels.energy), the masked softmax and the context sum_s a_s V_s; and its backward in another: the
weights' gradient from the values, the softmax's backward, and the energy's (the sigmoids recomputed), adding
the keys' share into StepKeys' sums and recording the values' (a_t, g_t) for StepMatrix's one bmm, as the
torch path does. Its exp is torch's fast vector exp (at most 20 ulp); in a training loop, whose keys come
with exp(-2k) computed once a batch (`factored_keys`), each sigmoid is 1 / (1 + exp(-2q) exp(-2k)) instead,
with no exp per (position, element). The tests hold both to the fp64 plain form to 1e-5 of each tensor's
largest value, like the compiled energy.

It runs where the run's plan uses decoder_step's kernels (nmt.plan; Inductor's C++ toolchain builds it,
a second or two once per machine) on a CPU, for one query step (T = 1) with fp32 or bf16 values; elsewhere
`additive_step` returns None and the caller goes the torch way.

    context, weights = additive_step(q, keys, v, values, mask)  # q (B, A) = W_s s; None: not here

Shapes: B batch, S source length, A attention size, D value size.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from nmt.kernels.compiled import address, cpp_kernel, fallback, is_in_torch_dispatch_mode
from nmt.kernels.energy import StepKeys
from nmt.kernels.stepweight import StepMatrix

SOURCE = Path(__file__).parent / "csrc" / "additive_step.cpp"
ARGTYPES = ["int64_t", "int64_t", *["uintptr_t"] * 13, *["int64_t"] * 4]
DTYPES = (torch.float32, torch.bfloat16)  # of the values
RANGE = 20.0  # the factored sigmoid's bound on |k| (additive_step.cpp says why)


class _AdditiveStep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, keys, v, values, mask, sums, steps, kernel, exp_keys):
        """q (B, A) fp32, keys (B, S, A) fp32, v (A,) fp32, values (B, S, D), mask (B, S) bool, exp_keys
        exp(-2 keys) or None; all contiguous."""
        B, S, A = keys.shape
        D = values.size(-1)
        weights, context = q.new_empty(B, S), values.new_empty(B, D)
        bf16 = int(values.dtype == torch.bfloat16)
        args = (q, keys, exp_keys, v, mask, values, weights, context)
        kernel(0, bf16, *map(address, args), 0, 0, 0, 0, 0, B, S, A, D)
        ctx.save_for_backward(q, keys, v, values, weights)
        ctx.sums, ctx.steps, ctx.kernel, ctx.exp_keys = sums, steps, kernel, exp_keys
        ctx.set_materialize_grads(False)  # no zeros for the weights' gradient when nothing trains on them
        return context, weights

    @staticmethod
    def backward(ctx, g_context: Tensor | None, g_weights: Tensor | None):
        q, keys, v, values, weights = ctx.saved_tensors
        B, S, A = keys.shape
        D = values.size(-1)
        g_context = values.new_zeros(B, D) if g_context is None else g_context.to(values.dtype).contiguous()
        g_weights = None if g_weights is None else g_weights.float().contiguous()
        g_scores, g_q, g_v = q.new_empty(B, S), q.new_empty(B, A), q.new_empty(B, A)
        sums = ctx.sums
        if sums is not None:  # a decoder loop's keys (StepKeys): this step's share goes into their sums
            sums.start(keys, v)
            g_w_keys = sums.g_w[:B]
        else:
            g_w_keys = torch.zeros_like(keys)
        bf16 = int(values.dtype == torch.bfloat16)
        args = (q, keys, ctx.exp_keys, v, None, values, weights, g_context, g_weights, g_scores, g_q, g_v, g_w_keys)
        ctx.kernel(1, bf16, *map(address, args), B, S, A, D)
        grad_keys = g_w_keys.mul_(4 * v) if sums is None and ctx.needs_input_grad[1] else None  # tanh' = 4 w
        a = weights.to(values.dtype).unsqueeze(1)  # (B, 1, S)
        if ctx.steps is not None:  # StepMatrix: one bmm over all steps forms the values' gradient
            ctx.steps.inputs.append(a)
            ctx.steps.grads.append(g_context.unsqueeze(1))
            grad_values = None
        else:
            grad_values = torch.bmm(a.transpose(1, 2), g_context.unsqueeze(1)) if ctx.needs_input_grad[3] else None
        return g_q, grad_keys, g_v.sum(0), grad_values, None, None, None, None, None


def additive_step(
    q: Tensor, keys: Tensor | StepKeys, v: Tensor, values: Tensor | StepMatrix, mask: Tensor
) -> tuple[Tensor, Tensor] | None:
    """One step of additive attention: q (B, A) (the projected query W_s s), keys (B, S, A) or StepKeys,
    v (A,), values (B, S, D) or StepMatrix, mask (B, S) True on real tokens -> (context (B, D) in the values'
    dtype, weights (B, S) fp32, exactly 0 on padding). None where the C++ kernels do not run (see the module
    docstring): the caller computes the step with torch operations."""
    if q.device.type != "cpu" or is_in_torch_dispatch_mode():  # torch's FLOP counter sees the torch path
        return fallback("decoder_step", "the attention step: not a CPU tensor, or under a torch dispatch mode")
    keys, sums, exp_keys = (keys.keys, keys.sums, keys.exp_keys) if isinstance(keys, StepKeys) else (keys, None, None)
    if isinstance(values, StepMatrix):
        if values.transpose:
            return fallback("decoder_step", "the attention step: values multiplied transposed")
        values, steps = values.matrix, values.steps
    else:
        steps = None
    if values.dtype not in DTYPES or keys.dtype != torch.float32 or mask.dtype != torch.bool:
        return fallback("decoder_step", "the attention step: values neither fp32 nor bf16, or keys not fp32")
    kernel = cpp_kernel(SOURCE, ARGTYPES, "decoder_step")
    if kernel is None:
        return None
    q, v = q.float().contiguous(), v.float().contiguous()
    keys, values, mask = keys.contiguous(), values.contiguous(), mask.contiguous()
    return _AdditiveStep.apply(q, keys, v, values, mask, sums, steps, kernel, exp_keys)


def factored_keys(keys: Tensor) -> Tensor | None:
    """exp(-2 k) for the keys (B, S, A) fp32 of a training loop's steps (StepKeys.exp_keys), once per batch: the
    step kernel then computes each sigmoid as 1 / (1 + exp(-2 q) exp(-2 k)), one exp per query element a step
    where the plain form takes one per (position, element). None where the kernel does not run, or where some
    |k| > RANGE (exp(-2 q) = inf could then meet exp(-2 k) = 0)."""
    if cpp_kernel(SOURCE, ARGTYPES, "decoder_step") is None:
        return None
    if keys.device.type != "cpu" or keys.dtype != torch.float32 or is_in_torch_dispatch_mode():
        return fallback("decoder_step", "the factored keys: not fp32 CPU keys, or under a torch dispatch mode")
    with torch.no_grad():
        if not bool(keys.abs().amax() <= RANGE):  # also NaN
            return fallback("decoder_step", f"the factored keys: some |k| over {RANGE:g} (or NaN)")
        return torch.exp(keys * -2.0).contiguous()
