"""The input-feeding decoder's teacher-forced loop as one autograd node, where decoder_step's kernels run in fp32.

A step of Luong's order with input feeding (query = the current state, one layer) and the additive score, the
multi30k_deen preset's decoder (what OpenNMT-py calls "mlp" attention), is

    h_t, cell_t = cell(x0_t + W_r [h~_{t-1}; h_{t-1}], cell_{t-1})   a matmul and one C++ kernel (nmt.kernels.lstm_cell)
    c_t, a_t = attend(W_s h_t, keys, values)                         a matmul and one C++ kernel (additive_step)
    h~_t = dropout(tanh(W_c [c_t; h_t]))                             a matmul, the dropout's mask, one C++ kernel

Through autograd each of them, and the joins, views and casts between them, is a node with its own bookkeeping,
forward and backward, at every step. Here the whole loop is one autograd.Function, as RNNsearch's is
(nmt.kernels.decoder_loop), and each direction is one C++ call (nmt/kernels/csrc/feed_loop.cpp): the forward
runs the steps above, the backward runs them in reverse by hand, with the products through the weights packed in
panels once per batch (nmt.kernels.step_gemm, StepWeight's) and the cell, attention step and h~ code the single
kernels share (csrc/lstm_cell.h, additive_step.h, feed_step.h). Python's dozen calls a step each way, with their
tensors and joins, were about 2% of a training step. Every step's rows lie one after another in one buffer per
quantity (N rows, rounded up for the weights' gradients as nmt.shapes rounds them), so the weights' gradients
are one matmul each after this node with nothing stacked (StepWeight / StepMatrix / StepKeys). The dropout masks
are drawn before the loop, step after step from torch's generator (nmt.dropout.Dropout.mask), as the plain loop
draws them: the same masks, so seeded and resumed runs are unchanged. The arithmetic is the loop's, up to the
order of a few sums and the tanh's last bits.

    plan = feed_plan(v, h, keys, values, mask, layers, combine, active, p)  # None: the plain loop
    out = feed_loop(plan, x0, h, c, feed, keys, values)                      # x0 (N, 4H): the loop's rows only

Layer 0's input x0 (the embeddings' share of the gates, one matmul before the loop) comes for the rows the loop
computes only, step after step as all its buffers are (`plan.positions` among the B x T): the positions after a
sentence's end (about an eighth of the multi30k_deen preset's B x T) cost no product, and the gates' gradients
are x0's as the kernel leaves them, where a (B, T, 4H) gradient took a copy with zeros at those positions.

fp32 only, every weight packed in panels (step_products); under bf16 autocast the step kernels run one by one.

Shapes: B batch, T steps, S source length, A attention size, D value size, H hidden, N the rows of all steps
(sum of `active`: step t computes the first active[t] sentences).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from nmt.kernels.compiled import address, cpp_kernel, enabled, fallback
from nmt.kernels.decoder_loop import loop_applies, loop_positions, scatter_steps
from nmt.kernels.energy import StepKeys
from nmt.kernels.lstm_cell import LayerParams
from nmt.kernels.step_gemm import Panels
from nmt.kernels.stepweight import StepMatrix, StepWeight
from nmt.shapes import padded_count

SOURCE = Path(__file__).parent / "csrc" / "feed_loop.cpp"  # every step, forward and backward
ARGTYPES = ["int64_t", "uintptr_t", "uintptr_t", *["int64_t"] * 5]


def feed_plan(
    v: Tensor | None,
    h: Tensor,
    keys,
    values,
    mask: Tensor,
    layers: list[LayerParams],
    combine: StepWeight,
    active: list[int],
    dropout: Callable[[tuple[int, int]], Tensor | None],
) -> _Plan | None:
    """Whether the loop runs here, and what it needs besides its tensors: from the state h (1, B, H), the
    additive energy's v (A,), the keys as StepKeys and the values as StepMatrix (AdditiveAttention's additive_v
    and for_steps), layer 0's parameters, W_c as a StepWeight and `dropout`, h~'s mask for a shape (n, H)
    (nmt.dropout.Dropout.mask; None: no dropout); None where it does not apply (another attention (v None) or
    layer count, no gradient, not a CPU, kernels not compiled, not fp32, autocast on)."""
    if not enabled("decoder_step") or not loop_applies(v, h, keys, values, layers, active) or combine.steps is None:
        return None  # no loop as one node (searches, validation: no gradient): the step kernels, one by one
    first = layers[0]
    tensors = (h, keys.keys, keys.query.weight, values.matrix, first.w_x, first.bias, first.w_r.weight, combine.weight)
    if torch.is_autocast_enabled("cpu") or any(t is None or t.dtype != torch.float32 for t in tensors):
        return fallback("decoder_step", "the input-feeding loop: under autocast or not in fp32 (the step kernels)")
    if mask.dtype != torch.bool or not all(
        t is None or t.is_contiguous() for t in (keys.keys, keys.exp_keys, values.matrix)
    ):
        return fallback("decoder_step", "the input-feeding loop: keys or values not contiguous (the step kernels)")
    packed = (keys.query.packed, first.w_r.packed, combine.packed)  # W_s, W_r, W_c in panels, both ways
    kernel = cpp_kernel(SOURCE, ARGTYPES, "decoder_step")
    if kernel is None:
        return None
    if not all(isinstance(x, Panels) and None not in (x.forward, x.backward) for x in packed):
        return fallback("decoder_step", "the input-feeding loop: its weights not in panels (step_products off)")
    return _Plan(v.float().contiguous(), keys, values, first.w_r, combine, mask.contiguous(), active, dropout, kernel)


def feed_loop(plan: _Plan, x0: Tensor, h: Tensor, c: Tensor, feed: Tensor, keys, values) -> tuple[Tensor, Tensor]:
    """The input-feeding steps of `plan` (feed_plan's) from layer 0's input x0 (N, 4H) fp32, the loop's rows
    step after step, and the state h, c (1, B, H), feed h~_{-1} (B, H) -> (h~_t (N, H), weights (N, S)), step
    after step."""
    if x0.shape != (sum(plan.active), 4 * h.size(-1)) or x0.dtype != torch.float32:
        raise ValueError(f"feed_loop: x0 {tuple(x0.shape)} {x0.dtype}, not the loop's rows (N, 4H) in fp32")
    h0, c0 = h.squeeze(0).contiguous(), c.squeeze(0).contiguous()
    w_s, w_r, w_c = keys.query.weight, plan.w_r.weight, plan.w_c.weight
    return _FeedLoop.apply(x0.contiguous(), h0, c0, feed.contiguous(), keys.keys, plan.v, values.matrix,
                           w_s, w_r, w_c, plan)  # fmt: skip


class _Plan:
    """What the loop needs besides its tensor inputs: the energy's v, the StepKeys / StepMatrix / StepWeight
    records the gradients go to, the packed weights, the mask, the rows of each step and where they stand among
    the batch's B x T positions, the dropout and the kernel."""

    def __init__(self, v: Tensor, keys: StepKeys, values: StepMatrix, w_r: StepWeight, w_c: StepWeight, mask, active,
                 dropout, kernel):  # fmt: skip
        self.v, self.exp_keys, self.sums, self.w_s = v, keys.exp_keys, keys.sums, keys.query
        self.values, self.w_r, self.w_c, self.mask, self.active = values, w_r, w_c, mask, active
        self.dropout, self.kernel = dropout, kernel
        self.rows = torch.tensor(active, dtype=torch.int64)  # the kernel reads them
        self.positions = loop_positions(active, len(active), mask.device)  # (N,): where the rows stand in B x T


def _call(kernel: Callable, what: int, tensors: list[Tensor | None], rows: Tensor, sizes: tuple[int, ...]) -> None:
    """The kernel on `tensors`' addresses (an int64 array in the order of feed_loop.cpp's Forward / Backward)."""
    addresses = torch.tensor([address(x) for x in tensors], dtype=torch.int64)
    kernel(what, addresses.data_ptr(), rows.data_ptr(), *sizes)


def _padded(rows: int, width: int, like: Tensor) -> Tensor:
    """(padded_count(rows), width) for a weight's gradient (nmt.shapes): the rows after `rows` zero."""
    out = like.new_empty(padded_count(rows), width)
    out[rows:].zero_()
    return out


class _FeedLoop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0, h0, c0, feed0, keys, v, values, w_s, w_r, w_c, plan: _Plan):
        B, S, A, D, H = keys.size(0), keys.size(1), keys.size(2), values.size(2), h0.size(1)
        T, N = len(plan.active), sum(plan.active)
        masks, row = None, 0
        for n in plan.active:  # the dropout's draws, step after step as the plain loop takes them
            keep = plan.dropout((n, H))
            if keep is None:
                break
            masks = h0.new_empty(N, H) if masks is None else masks
            masks[row : row + n].copy_(keep)
            row += n
        states, joined, combined = _padded(N, H, h0), _padded(N, 2 * H, h0), _padded(N, D + H, h0)
        cells, tanhs, attentional = c0.new_empty(N, H), h0.new_empty(N, H), h0.new_empty(N, H)
        weights, queries, gates = x0.new_empty(N, S), keys.new_empty(N, A), x0.new_empty(N, 4 * H)
        tensors = [x0, h0, c0, feed0, keys, plan.exp_keys, v, plan.mask, values, plan.w_r.packed.forward,
                   plan.w_s.packed.forward, plan.w_c.packed.forward, masks, states, cells, tanhs, attentional,
                   weights, queries, joined, gates, combined, h0.new_empty(B, H), values.new_empty(B, D)]  # fmt: skip
        _call(plan.kernel, 0, tensors, plan.rows, (T, S, A, D, H))
        ctx.save_for_backward(x0, c0, keys, v, values, weights, states, cells, tanhs, masks, queries, gates,
                              joined, combined)  # fmt: skip
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        return attentional, weights

    @staticmethod
    def backward(ctx, g_attentional: Tensor | None, g_weights: Tensor | None):
        x0, c0, keys, v, values, weights, states, cells, tanhs, masks, queries, gates, joined, combined = (
            ctx.saved_tensors
        )
        plan = ctx.plan
        B, S, A, D, H = keys.size(0), keys.size(1), keys.size(2), values.size(2), c0.size(1)
        T, N = len(plan.active), sum(plan.active)
        g_v = v.new_zeros(A)
        plan.sums.start(keys, v)  # the keys' gradient: StepKeys' sums, 4 v applied after this node
        g_pre, g_q, g_z = _padded(N, H, c0), _padded(N, A, c0), _padded(N, 4 * H, c0)
        g_context, g_x, g_c = values.new_empty(N, D), c0.new_empty(B, 2 * H), c0.new_empty(B, H)
        g_attentional = None if g_attentional is None else g_attentional.contiguous()
        g_weights = None if g_weights is None else g_weights.contiguous()
        scratch = [c0.new_empty(B, H), c0.new_empty(B, H), c0.new_empty(B, D + H), c0.new_empty(B, S),
                   c0.new_empty(B, A)]  # fmt: skip
        tensors = [x0, c0, keys, plan.exp_keys, v, values, weights, states, cells, tanhs, masks, queries, gates,
                   plan.w_r.packed.backward, plan.w_s.packed.backward, plan.w_c.packed.backward, g_attentional,
                   g_weights, g_v, g_pre, g_context, g_q, g_z, plan.sums.g_w, g_x, g_c, *scratch]  # fmt: skip
        _call(plan.kernel, 1, tensors, plan.rows, (T, S, A, D, H))
        # the weights' gradients, one matmul each after this node (StepWeight, StepMatrix): all steps' rows at once
        plan.w_c.steps.inputs.append(combined)
        plan.w_c.steps.grads.append(g_pre)
        plan.w_s.steps.inputs.append(states)
        plan.w_s.steps.grads.append(g_q)
        plan.w_r.steps.inputs.append(joined)
        plan.w_r.steps.grads.append(g_z)
        # the values': (B, T, S) and (B, T, D) with zeros where a sentence had ended, one record each (where a
        # record a step took F.pad and a join after it)
        plan.values.steps.inputs.append(scatter_steps(weights, plan.positions, B, T))
        plan.values.steps.grads.append(scatter_steps(g_context, plan.positions, B, T))
        # step 0 computes every sentence: the gradients of the initial state are (B, H)
        need = ctx.needs_input_grad
        g_x0 = g_z[:N] if need[0] else None  # the gates' gradients are x0's (its rows are the loop's)
        g_h0 = g_x[:, H:].contiguous() if need[1] else None
        g_c0 = g_c if need[2] else None
        g_feed0 = g_x[:, :H].contiguous() if need[3] else None
        return g_x0, g_h0, g_c0, g_feed0, None, g_v, None, None, None, None, None
