"""RNNsearch's teacher-forced decoder loop as one autograd node, where decoder_step's kernels run (nmt.plan).

A decoder step of RNNsearch (query = the previous state, no input feeding, one layer) is five calls:

    q_t = W_s s_{t-1}                                     the query projection (StepWeight)
    c_t, a_t = attend(q_t, keys, values)                  one C++ kernel (nmt.kernels.additive_step)
    s_t, cell_t = cell(x0_t + W_r [c_t; s_{t-1}], cell)   a matmul (StepWeight) and one C++ kernel (kernels.lstm_cell)

Through autograd each of them, and the views, casts and joins between them, is a node with its own
bookkeeping: some two hundred dispatched operations a step, forward and backward, a cost per step whatever
the batch. Windows of several verses take about three decoder steps for every one of single verses for the
same target tokens, so that cost per step is what kept them slower (README "Long inputs"). Here
the whole loop is one autograd.Function: its forward runs the steps above without autograd, and its
backward runs them in reverse with the same kernels and products, by hand. Every weight's gradient is still
formed the StepWeight / StepMatrix / StepKeys way (each step records its (input, gradient) pair, one matmul
over all steps after this node), so the arithmetic is the loop's, up to the order of a few sums (the state's
gradient is added up in fp32 here, in the matmul dtype by autograd).

    out = decoder_loop(v, x0, h, c, keys, values, mask, layers, active)  # None: take the plain loop

`v` is the additive attention's (Attention.additive_v: None for any other attention): the attention hands
the loop what it needs, and the kernels never import the model.

Shapes: B batch, T steps, S source length, A attention size, D value size, H hidden, N the rows of all steps
(sum of `active`: step t computes the first active[t] sentences).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.kernels.additive_step import ARGTYPES, DTYPES, SOURCE
from nmt.kernels.compiled import address, cpp_kernel, enabled, fallback, is_in_torch_dispatch_mode
from nmt.kernels.energy import StepKeys
from nmt.kernels.lstm_cell import CELL_ARGTYPES, CELL_SOURCE, LayerParams
from nmt.kernels.stepweight import StepMatrix, StepWeight, step_input_gradient, step_product


def decoder_loop(
    v: Tensor | None,
    x0: Tensor,
    h: Tensor,
    c: Tensor,
    keys,
    values,
    mask: Tensor,
    layers: list[LayerParams],
    active: list[int],
) -> tuple[Tensor, Tensor, Tensor] | None:
    """RNNsearch's steps from layer 0's input x0 (B, T, 4H) fp32 and the state h (1, B, H), c (1, B, H) fp32,
    with the additive energy's v (A,), the keys as StepKeys and the values as StepMatrix (AdditiveAttention's
    additive_v and for_steps) -> (contexts (N, D), outputs s_t (N, H), weights (N, S)), step after step; None
    where this does not apply (another attention (v None) or layer count, no gradient, not a CPU, kernels not
    compiled, dtypes the kernels do not take)."""
    if not enabled("decoder_step") or not loop_applies(v, h, keys, values, layers, active):
        return None  # no loop as one node (searches, validation: no gradient): the step kernels, one by one
    w_s, w_r, matrix = keys.query.weight, layers[0].w_r.weight, values.matrix
    dtype = w_r.dtype
    if (
        matrix.dtype not in DTYPES
        or keys.keys.dtype != torch.float32
        or w_s.dtype != dtype
        or h.dtype != dtype
        or dtype not in (torch.float32, torch.bfloat16)
        or x0.dtype != torch.float32
        or c.dtype != torch.float32
        or x0.stride(-1) != 1
        or mask.dtype != torch.bool
    ):
        return fallback("decoder_step", "RNNsearch's loop: dtypes or layouts its kernels do not take")
    step_kernel, cell_kernel = loop_kernels()
    if step_kernel is None or cell_kernel is None:
        return None
    v = v.float().contiguous()
    plan = _Plan(keys, values, layers[0].w_r, mask.contiguous(), active, step_kernel, cell_kernel)
    return _Loop.apply(x0, h.squeeze(0).contiguous(), c.squeeze(0).contiguous(), keys.keys, v, matrix, w_s, w_r, plan)


def loop_applies(v: Tensor | None, h: Tensor, keys, values, layers: list[LayerParams], active) -> bool:
    """Whether a training loop of the additive attention can run as one node here (this module's and
    nmt.kernels.feed_loop's): v given (AdditiveAttention), StepKeys with a recorded W_s, StepMatrix values,
    one layer with a recorded W_r, every sentence at step 0, a CPU, no torch dispatch mode (FLOP counters)."""
    return (
        v is not None
        and isinstance(keys, StepKeys)
        and isinstance(keys.query, StepWeight)
        and keys.query.steps is not None
        and isinstance(values, StepMatrix)
        and not values.transpose
        and len(layers) == 1
        and h.size(0) == 1
        and active[0] == h.size(1)
        and layers[0].w_r.steps is not None
        and h.device.type == "cpu"
        and not is_in_torch_dispatch_mode()
    )


def loop_positions(active: list[int], T: int, device: torch.device) -> Tensor:
    """Where a loop's rows, step after step (step t: the first active[t] sentences), stand among the B x T
    positions of the batch: flat indices (N,), made on the host (a mask's selection would read a device's
    tensor) and put on `device`."""
    B = active[0]
    grid = torch.arange(B) * T + torch.arange(T)[:, None]  # (T, B): b T + t
    return grid[torch.arange(B) < torch.tensor(active)[:, None]].to(device)  # step after step


def scatter_steps(rows: Tensor, positions: Tensor, B: int, T: int) -> Tensor:
    """A loop's rows (N, X), step after step, at their `positions` (loop_positions) in (B, T, X), zeros elsewhere."""
    return rows.new_zeros(B * T, rows.size(-1)).index_copy_(0, positions, rows).view(B, T, -1)


def loop_kernels() -> tuple:
    """The attention step's and the LSTM cell's C++ kernels (None each where they are not built)."""
    return cpp_kernel(SOURCE, ARGTYPES, "decoder_step"), cpp_kernel(CELL_SOURCE, CELL_ARGTYPES, "decoder_step")


class _Plan:
    """What the loop needs besides its tensor inputs: the StepKeys / StepMatrix / StepWeight records the
    gradients go to, the packed weights, the mask, the rows of each step and the two kernels."""

    def __init__(self, keys: StepKeys, values: StepMatrix, w_r: StepWeight, mask, active, step_kernel, cell_kernel):
        self.exp_keys, self.sums, self.w_s = keys.exp_keys, keys.sums, keys.query
        self.values, self.w_r, self.mask, self.active = values, w_r, mask, active
        self.step_kernel, self.cell_kernel = step_kernel, cell_kernel


class _Loop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0, h0, c0, keys, v, values, w_s, w_r, plan: _Plan):
        S, A, D, H = keys.size(1), keys.size(2), values.size(2), h0.size(1)
        N = sum(plan.active)
        contexts, outputs = values.new_empty(N, D), h0.new_empty(N, H)
        weights, cells = x0.new_empty(N, S), c0.new_empty(N, H)
        queries, joined, gates = [], [], []  # per step: q_t fp32 (n, A), [c_t; s_{t-1}] (n, D + H), W_r [..] (n, 4H)
        bf16_values, bf16 = int(values.dtype == torch.bfloat16), int(w_r.dtype == torch.bfloat16)
        h, c, row = h0, c0, 0
        for t, n in enumerate(plan.active):
            h, c = h[:n], c[:n]  # the sentences still decoded: the first n rows
            q = step_product(h, w_s, plan.w_s.packed).float()  # (n, A)
            context, weight = contexts[row : row + n], weights[row : row + n]
            exp_keys = None if plan.exp_keys is None else plan.exp_keys[:n]
            args = (q, keys[:n], exp_keys, v, plan.mask[:n], values[:n], weight, context)
            plan.step_kernel(0, bf16_values, *map(address, args), 0, 0, 0, 0, 0, n, S, A, D)
            x = torch.cat([context.to(w_r.dtype), h], dim=1)  # (n, D + H)
            wx = step_product(x, w_r, plan.w_r.packed)  # (n, 4H)
            h_new, cell = outputs[row : row + n], cells[row : row + n]
            x0_t = x0[:n, t]  # (n, 4H), its rows T x 4H apart
            addresses = (wx.data_ptr(), c.data_ptr(), cell.data_ptr(), h_new.data_ptr(), 0, 0, 0, 0)
            plan.cell_kernel(0, bf16, x0_t.data_ptr(), x0_t.stride(0), *addresses, n, H)
            queries.append(q)
            joined.append(x)
            gates.append(wx)
            h, c, row = h_new, cell, row + n
        ctx.save_for_backward(x0, h0, c0, keys, v, values, w_s, w_r, outputs, weights, cells)
        ctx.plan, ctx.steps = plan, (queries, joined, gates)
        ctx.set_materialize_grads(False)
        return contexts, outputs, weights

    @staticmethod
    def backward(ctx, g_contexts: Tensor | None, g_outputs: Tensor | None, g_weights: Tensor | None):
        x0, h0, c0, keys, v, values, w_s, w_r, outputs, weights, cells = ctx.saved_tensors
        plan, (queries, joined, gates) = ctx.plan, ctx.steps
        S, A, D, H = keys.size(1), keys.size(2), values.size(2), h0.size(1)
        bf16_values, bf16 = int(values.dtype == torch.bfloat16), int(w_r.dtype == torch.bfloat16)
        g_x0, g_v = torch.empty_like(x0), v.new_zeros(A)  # g_x0: each step's rows written below, the rest zeroed
        g_x0[:, len(plan.active) :].zero_()
        plan.sums.start(keys, v)  # the keys' gradient: StepKeys' sums, 4 v applied after this node
        starts = [0]
        for n in plan.active:
            starts.append(starts[-1] + n)
        g_h = g_c = None  # the gradients of s_t and cell_t (fp32) from step t + 1, for its rows
        for t in reversed(range(len(plan.active))):
            n, row = plan.active[t], starts[t]
            g_state = c0.new_zeros(n, H) if g_outputs is None else g_outputs[row : row + n].to(torch.float32, copy=True)
            g_cell = c0.new_zeros(n, H)
            if g_h is not None:
                g_state[: g_h.size(0)] += g_h
                g_cell[: g_c.size(0)] += g_c
            c_prev = c0[:n] if t == 0 else cells[starts[t - 1] : starts[t - 1] + n]
            h_prev = h0[:n] if t == 0 else outputs[starts[t - 1] : starts[t - 1] + n]
            x0_t = x0[:n, t]
            dh = g_state.to(w_r.dtype)
            g_z, g_c = c0.new_empty(n, 4 * H), c0.new_empty(n, H)
            addresses = (gates[t], c_prev, cells[row : row + n], None, dh, g_cell, g_z, g_c)
            plan.cell_kernel(1, bf16, x0_t.data_ptr(), x0_t.stride(0), *map(address, addresses), n, H)
            g_x0[:n, t] = g_z
            g_x0[n:, t].zero_()  # the sentences that had ended by step t
            g_wx = g_z.to(w_r.dtype)
            plan.w_r.steps.inputs.append(joined[t])  # W_r's gradient: one matmul after this node
            plan.w_r.steps.grads.append(g_wx)
            g_x = step_input_gradient(g_wx, w_r, plan.w_r.packed)  # (n, D + H)
            g_context = g_x[:, :D].to(values.dtype)
            if g_contexts is not None:
                g_context = g_context + g_contexts[row : row + n]
            g_context = g_context.contiguous()
            g_weight = None if g_weights is None else g_weights[row : row + n].float().contiguous()
            g_scores, g_q, g_v_rows = keys.new_empty(n, S), keys.new_empty(n, A), keys.new_empty(n, A)
            exp_keys = None if plan.exp_keys is None else plan.exp_keys[:n]
            args = (queries[t], keys[:n], exp_keys, v, None, values[:n], weights[row : row + n], g_context, g_weight,
                    g_scores, g_q, g_v_rows, plan.sums.g_w[:n])  # fmt: skip
            plan.step_kernel(1, bf16_values, *map(address, args), n, S, A, D)
            g_v += g_v_rows.sum(0)
            plan.values.steps.inputs.append(weights[row : row + n].to(values.dtype).unsqueeze(1))  # (n, 1, S)
            plan.values.steps.grads.append(g_context.unsqueeze(1))  # (n, 1, D)
            g_q = g_q.to(w_s.dtype)
            plan.w_s.steps.inputs.append(h_prev)
            plan.w_s.steps.grads.append(g_q)
            g_h = g_x[:, D:].float() + step_input_gradient(g_q, w_s, plan.w_s.packed).float()  # s_{t-1}'s
        g_h0 = g_h.to(h0.dtype) if ctx.needs_input_grad[1] else None  # step 0 computes every sentence: (B, H)
        g_c0 = g_c if ctx.needs_input_grad[2] else None
        return g_x0, g_h0, g_c0, None, g_v, None, None, None, None
