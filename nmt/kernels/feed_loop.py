"""The input-feeding decoder's teacher-forced loop as one autograd node, where compiled kernels run on a CPU in fp32.

A step of Luong's order with input feeding (query = the current state, one layer) and the additive score, the
multi30k_deen preset's decoder (what OpenNMT-py calls "mlp" attention), is

    h_t, cell_t = cell(x0_t + W_r [h~_{t-1}; h_{t-1}], cell_{t-1})   a matmul and one C++ kernel (nmt.kernels.lstm)
    c_t, a_t = attend(W_s h_t, keys, values)                         a matmul and one C++ kernel (attention_step)
    h~_t = dropout(tanh(W_c [c_t; h_t]))                             a matmul, the dropout's mask, one C++ kernel

Through autograd each of them, and the joins, views and casts between them, is a node with its own bookkeeping,
forward and backward, at every step. Here the whole loop is one autograd.Function, as RNNsearch's is
(nmt.kernels.decoder_loop): its forward runs the steps above without autograd, its backward runs them in reverse
by hand with the same kernels and products (h~'s tanh and dropout, and the sums of the gradients arriving from
the next step, in nmt/kernels/csrc/feed_step.cpp: one call each way where torch took a dozen operations). The
weights' gradients are formed the StepWeight / StepMatrix / StepKeys way (each step records its (input,
gradient) pair; one matmul over all steps after this node), and the dropout masks are drawn step after step
from torch's generator (nmt.dropout.Dropout.mask) as in the plain loop (the same masks, so seeded and resumed
runs are unchanged). The arithmetic is the loop's, up to the order of a few sums and the tanh's last bits.

    out = feed_loop(v, x0, h, c, feed, keys, values, mask, layers, combine, active, p)  # None: the plain loop

fp32 only (the kernels take bf16, but this preset runs its eager kernels under bf16 autocast: nmt.kernels.compiled).

Shapes: B batch, T steps, S source length, A attention size, D value size, H hidden, N the rows of all steps
(sum of `active`: step t computes the first active[t] sentences).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from nmt.kernels.compiled import address, cpp_kernel
from nmt.kernels.decoder_loop import loop_applies, loop_kernels
from nmt.kernels.energy import StepKeys
from nmt.kernels.lstm import LayerParams
from nmt.kernels.stepweight import StepMatrix, StepWeight, step_input_gradient, step_product

SOURCE = Path(__file__).parent / "csrc" / "feed_step.cpp"  # h~'s tanh and dropout, forward and backward
ARGTYPES = ["int64_t", *["uintptr_t"] * 9, *["int64_t"] * 4]


def feed_loop(
    v: Tensor | None,
    x0: Tensor,
    h: Tensor,
    c: Tensor,
    feed: Tensor,
    keys,
    values,
    mask: Tensor,
    layers: list[LayerParams],
    combine: StepWeight,
    active: list[int],
    dropout: Callable[[tuple[int, int]], Tensor | None],
) -> tuple[Tensor, Tensor] | None:
    """The input-feeding steps from layer 0's input x0 (B, T, 4H) and the state h, c (1, B, H), feed h~_{-1}
    (B, H), with the additive energy's v (A,), the keys as StepKeys and the values as StepMatrix
    (AdditiveAttention's additive_v and for_steps), W_c as a StepWeight and `dropout`, h~'s mask for a shape
    (n, H) (nmt.dropout.Dropout.mask; None: no dropout) -> (h~_t (N, H), weights (N, S)), step after step;
    None where this does not apply (another attention (v None) or layer count, no gradient, not a CPU,
    kernels not compiled, not fp32)."""
    if not loop_applies(v, x0, h, keys, values, layers, active) or combine.steps is None:
        return None
    tensors = (x0, h, c, feed, keys.keys, keys.query.weight, values.matrix, layers[0].w_r.weight, combine.weight)
    if any(t.dtype != torch.float32 for t in tensors) or x0.stride(-1) != 1 or mask.dtype != torch.bool:
        return None
    step_kernel, cell_kernel = loop_kernels()
    feed_kernel = cpp_kernel(SOURCE, ARGTYPES)
    if step_kernel is None or cell_kernel is None or feed_kernel is None:
        return None
    kernels = (step_kernel, cell_kernel, feed_kernel)
    plan = _Plan(keys, values, layers[0].w_r, combine, mask.contiguous(), active, dropout, kernels)
    h0, c0 = h.squeeze(0).contiguous(), c.squeeze(0).contiguous()
    w_s, w_r, w_c = keys.query.weight, layers[0].w_r.weight, combine.weight
    return _FeedLoop.apply(x0, h0, c0, feed.contiguous(), keys.keys, v.float().contiguous(), values.matrix,
                           w_s, w_r, w_c, plan)  # fmt: skip


class _Plan:
    """What the loop needs besides its tensor inputs: the StepKeys / StepMatrix / StepWeight records the
    gradients go to, the packed weights, the mask, the rows of each step, the dropout and the three kernels."""

    def __init__(self, keys: StepKeys, values: StepMatrix, w_r: StepWeight, w_c: StepWeight, mask, active, dropout,
                 kernels):  # fmt: skip
        self.exp_keys, self.sums, self.w_s = keys.exp_keys, keys.sums, keys.query
        self.values, self.w_r, self.w_c, self.mask, self.active = values, w_r, w_c, mask, active
        self.dropout, (self.step_kernel, self.cell_kernel, self.feed_kernel) = dropout, kernels


class _FeedLoop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0, h0, c0, feed0, keys, v, values, w_s, w_r, w_c, plan: _Plan):
        S, A, D, H = keys.size(1), keys.size(2), values.size(2), h0.size(1)
        N = sum(plan.active)
        states, cells, tanhs = h0.new_empty(N, H), c0.new_empty(N, H), h0.new_empty(N, H)
        attentional, weights, contexts = h0.new_empty(N, H), x0.new_empty(N, S), values.new_empty(N, D)
        masks = None
        queries, joined, gates, combined = [], [], [], []  # per step: W_s h (n, A), [h~; h] (n, 2H), z (n, 4H), [c; h]
        h, c, feed, row = h0, c0, feed0, 0
        for t, n in enumerate(plan.active):
            h, c, feed = h[:n], c[:n], feed[:n]  # the sentences still decoded: the first n rows
            x = torch.cat([feed, h], dim=1)  # (n, 2H)
            wx = step_product(x, w_r, plan.w_r.packed)  # (n, 4H)
            h_new, cell = states[row : row + n], cells[row : row + n]
            x0_t = x0[:n, t]  # (n, 4H), its rows T x 4H apart
            addresses = (wx.data_ptr(), c.data_ptr(), cell.data_ptr(), h_new.data_ptr(), 0, 0, 0, 0)
            plan.cell_kernel(0, 0, x0_t.data_ptr(), x0_t.stride(0), *addresses, n, H)
            q = step_product(h_new, w_s, plan.w_s.packed)  # (n, A)
            context, weight = contexts[row : row + n], weights[row : row + n]
            exp_keys = None if plan.exp_keys is None else plan.exp_keys[:n]
            args = (q, keys[:n], exp_keys, v, plan.mask[:n], values[:n], weight, context)
            plan.step_kernel(0, 0, *map(address, args), 0, 0, 0, 0, 0, n, S, A, D)
            y = torch.cat([context, h_new], dim=1)  # (n, D + H)
            z = step_product(y, w_c, plan.w_c.packed)  # (n, H)
            feed = attentional[row : row + n]
            keep = plan.dropout((n, H))  # the dropout's draw, step after step as in the plain loop
            if keep is not None:
                masks = h0.new_empty(N, H) if masks is None else masks
                keep = masks[row : row + n].copy_(keep)
            args = (z, keep, tanhs[row : row + n], feed)  # feed = tanh(z) * keep
            plan.feed_kernel(0, *map(address, args), 0, 0, 0, 0, 0, 0, n, 0, H)
            queries.append(q)
            joined.append(x)
            gates.append(wx)
            combined.append(y)
            h, c, row = h_new, cell, row + n
        ctx.save_for_backward(x0, h0, c0, keys, v, values, w_s, w_r, w_c, states, cells, tanhs, weights, masks)
        ctx.plan, ctx.steps = plan, (queries, joined, gates, combined)
        ctx.set_materialize_grads(False)
        return attentional, weights

    @staticmethod
    def backward(ctx, g_attentional: Tensor | None, g_weights: Tensor | None):
        x0, h0, c0, keys, v, values, w_s, w_r, w_c, states, cells, tanhs, weights, masks = ctx.saved_tensors
        plan, (queries, joined, gates, combined) = ctx.plan, ctx.steps
        S, A, D, H = keys.size(1), keys.size(2), values.size(2), h0.size(1)
        g_x0, g_v = torch.empty_like(x0), v.new_zeros(A)  # g_x0: each step's rows written below, the rest zeroed
        g_x0[:, len(plan.active) :].zero_()
        plan.sums.start(keys, v)  # the keys' gradient: StepKeys' sums, 4 v applied after this node
        starts = [0]
        for n in plan.active:
            starts.append(starts[-1] + n)
        g_feed = g_h = g_c = None  # the gradients of h~_t, h_t and cell_t from step t + 1, for its rows
        g_attentional = None if g_attentional is None else g_attentional.contiguous()
        for t in reversed(range(len(plan.active))):
            n, row = plan.active[t], starts[t]
            rows = slice(row, row + n)
            # h~'s gradient through the dropout and tanh' = 1 - tanh^2, and the next step's gradients of the state
            # and the cell on the rows it decoded (zero below): one call
            g_pre, g_state, g_cell = h0.new_empty(n, H), h0.new_empty(n, H), c0.new_empty(n, H)
            m = 0 if g_feed is None else g_feed.size(0)
            g_att = None if g_attentional is None else g_attentional[rows]
            mask_t = None if masks is None else masks[rows]
            args = (g_att, g_feed, g_h, g_c, mask_t, tanhs[rows], g_pre, g_state, g_cell)
            gs = 0 if g_feed is None else g_feed.stride(0)  # g_feed, g_h: the halves of (m, 2H) rows
            plan.feed_kernel(1, *map(address, args), gs, n, m, H)
            plan.w_c.steps.inputs.append(combined[t])  # W_c's gradient: one matmul after this node
            plan.w_c.steps.grads.append(g_pre)
            g_y = step_input_gradient(g_pre, w_c, plan.w_c.packed)  # (n, D + H)
            g_state += g_y[:, D:]
            g_context = g_y[:, :D].contiguous()
            g_weight = None if g_weights is None else g_weights[rows].contiguous()
            g_scores, g_q, g_v_rows = keys.new_empty(n, S), keys.new_empty(n, A), keys.new_empty(n, A)
            exp_keys = None if plan.exp_keys is None else plan.exp_keys[:n]
            args = (queries[t], keys[:n], exp_keys, v, None, values[:n], weights[rows], g_context, g_weight,
                    g_scores, g_q, g_v_rows, plan.sums.g_w[:n])  # fmt: skip
            plan.step_kernel(1, 0, *map(address, args), n, S, A, D)
            g_v += g_v_rows.sum(0)
            plan.values.steps.inputs.append(weights[rows].unsqueeze(1))  # (n, 1, S)
            plan.values.steps.grads.append(g_context.unsqueeze(1))  # (n, 1, D)
            plan.w_s.steps.inputs.append(states[rows])
            plan.w_s.steps.grads.append(g_q)
            g_state += step_input_gradient(g_q, w_s, plan.w_s.packed)
            c_prev = c0[:n] if t == 0 else cells[starts[t - 1] : starts[t - 1] + n]
            x0_t = x0[:n, t]
            g_z, g_c = c0.new_empty(n, 4 * H), c0.new_empty(n, H)
            addresses = (gates[t], c_prev, cells[rows], None, g_state, g_cell, g_z, g_c)
            plan.cell_kernel(1, 0, x0_t.data_ptr(), x0_t.stride(0), *map(address, addresses), n, H)
            g_x0[:n, t] = g_z
            g_x0[n:, t].zero_()  # the sentences that had ended by step t
            plan.w_r.steps.inputs.append(joined[t])  # W_r's gradient: one matmul after this node
            plan.w_r.steps.grads.append(g_z)
            g_x = step_input_gradient(g_z, w_r, plan.w_r.packed)  # (n, 2H): [h~_{t-1}; h_{t-1}]'s
            g_feed, g_h = g_x[:, :H], g_x[:, H:]
        # step 0 computes every sentence: the gradients of the initial state are (B, H)
        need = ctx.needs_input_grad
        g_h0 = g_h.contiguous() if need[1] else None
        g_c0 = g_c if need[2] else None
        g_feed0 = g_feed.contiguous() if need[3] else None
        return g_x0, g_h0, g_c0, g_feed0, None, g_v, None, None, None, None, None
