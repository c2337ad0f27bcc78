"""The decoder's stacked LSTM written out one step at a time, with nn.LSTM's own parameters.

    layers = layer_params(decoder.rnn, embed_size, dtype)          # once per batch
    top, h, c = lstm_step(x0, [feed, context], h, c, layers, dropout)   # every decoder step

Written out rather than calling nn.LSTM once per step: the embeddings' share of layer 0's input is projected
for all steps in one matmul (x0 = W_x y + b, by the caller), the weights are cast once per batch under
autocast, and the weights used at every step get their gradient in one matmul over all steps
(nmt.kernels.stepweight). The arithmetic is nn.LSTM's (gates i, f, g, o), and checkpoints hold nn.LSTM's parameters.
Where the run's plan uses decoder_step's kernels (nmt.plan) on a CPU, a layer's elementwise part (the
gates' sigmoids and tanhs, the new cell and output) is one C++ call each way (nmt/kernels/csrc/lstm_cell.cpp) instead of
a dozen torch operations forward and twice as many backward: a decoder step pays each operation's fixed cost,
and long inputs take more steps for the same tokens (README "Long inputs").
Shapes: L layers, B batch, H hidden, E embedding.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from nmt.kernels.compiled import address, cpp_kernel, fallback, is_in_torch_dispatch_mode
from nmt.kernels.stepweight import StepWeight

CELL_SOURCE = Path(__file__).parent / "csrc" / "lstm_cell.cpp"
CELL_ARGTYPES = ["int64_t", "int64_t", "uintptr_t", "int64_t", *["uintptr_t"] * 8, "int64_t", "int64_t"]


class LayerParams(NamedTuple):
    w_x: Tensor | None  # (4H, E) layer 0 only: the embedding's share of W_ih
    w_r: StepWeight  # (4H, recurrent inputs + H)
    bias: Tensor  # (4H,)


def layer_params(rnn: nn.LSTM, embed_size: int, dtype: torch.dtype | None) -> list[LayerParams]:
    """Per layer: W_x multiplies what is known before decoding starts (layer 0: the embeddings, for all steps
    in one matmul), W_r everything recurrent ([feed; context; h_{t-1}] in layer 0, [x; h_{t-1}] above it),
    b = b_ih + b_hh; slices of `rnn`'s parameters, cast to `dtype` (the autocast dtype, or None)."""
    layers = []
    for layer in range(rnn.num_layers):
        w_ih, w_hh = getattr(rnn, f"weight_ih_l{layer}"), getattr(rnn, f"weight_hh_l{layer}")
        bias = getattr(rnn, f"bias_ih_l{layer}") + getattr(rnn, f"bias_hh_l{layer}")
        w_x = w_ih[:, :embed_size] if layer == 0 else None
        w_r = torch.cat([w_ih[:, embed_size:], w_hh] if layer == 0 else [w_ih, w_hh], dim=1)
        if w_x is not None and dtype is not None:
            w_x = w_x.to(dtype)
        layers.append(LayerParams(w_x, StepWeight.of(w_r, dtype), bias))
    return layers


def lstm_step(
    x0: Tensor, recurrent: list[Tensor], h: Tensor, c: Tensor, layers: list[LayerParams], dropout: nn.Module
) -> tuple[Tensor, Tensor, Tensor]:
    """One step through every layer: x0 (B, 4H) is layer 0's W_x x + b, `recurrent` its other inputs
    ([feed; context]), h and c (L, B, H) the previous state, `dropout` applied between layers.

    Returns (top output (B, H), h (L, B, H), c (L, B, H)); under autocast h is in the matmul dtype (the next
    matmuls' input, cast once) and c stays fp32 (it accumulates over every step).
    """
    hs, cs, below = [], [], None
    for index, p in enumerate(layers):
        inputs = recurrent if index == 0 else [dropout(below)]
        x, wx = (x0 if index == 0 else p.bias), p.w_r(torch.cat([*inputs, layer(h, index)], dim=-1))  # (B, 4H) each
        below, cell = lstm_cell(x, wx, layer(c, index))  # h in the matmul dtype
        hs.append(below)
        cs.append(cell)
    if len(layers) == 1:
        return below, below[None], cell[None]  # views: no copy for the usual single layer
    return below, torch.stack(hs), torch.stack(cs)


def layer(x: Tensor, index: int) -> Tensor:
    """Layer `index` of a state (L, B, H): for one layer a squeeze, whose backward is a view (indexing's
    allocates a zero (L, B, H) gradient and copies into it, at every decoder step)."""
    return x.squeeze(0) if x.size(0) == 1 else x[index]


def lstm_cell(x0: Tensor, wx: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """The gates z = x0 + wx (B, 4H) (x0 may be the bias (4H,)) and the previous cell c (B, H) fp32 ->
    (h (B, H) in wx's dtype, the new cell (B, H) fp32): one C++ call where decoder_step's kernels run, else
    torch operations."""
    step = _compiled_cell(x0, wx, c)
    if step is not None:
        return step
    i, f, g, o = (x0 + wx).chunk(4, dim=-1)
    cell = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return (torch.sigmoid(o) * torch.tanh(cell)).to(wx.dtype), cell


def _compiled_cell(x0: Tensor, wx: Tensor, c: Tensor) -> tuple[Tensor, Tensor] | None:
    if wx.device.type != "cpu" or is_in_torch_dispatch_mode():  # torch's FLOP counter sees the torch path
        return fallback("decoder_step", "the LSTM cell: not a CPU tensor, or under a torch dispatch mode")
    if x0.dtype != torch.float32 or c.dtype != torch.float32 or wx.dtype not in (torch.float32, torch.bfloat16):
        return fallback("decoder_step", "the LSTM cell: x0 and c not fp32, or wx neither fp32 nor bf16")
    if x0.stride(-1) != 1 or (x0.dim() == 2 and x0.size(0) > 1 and x0.stride(0) < x0.size(1)):
        return fallback("decoder_step", "the LSTM cell: x0's rows overlap or its last dimension is strided")
    kernel = cpp_kernel(CELL_SOURCE, CELL_ARGTYPES, "decoder_step")
    if kernel is None:
        return None
    return _LSTMCell.apply(x0, wx.contiguous(), c.contiguous(), kernel)


class _LSTMCell(torch.autograd.Function):
    """lstm_cell through nmt/kernels/csrc/lstm_cell.cpp; the backward recomputes the gates from x0 + wx."""

    @staticmethod
    def forward(ctx, x0: Tensor, wx: Tensor, c: Tensor, kernel) -> tuple[Tensor, Tensor]:
        B, H = c.shape
        stride = x0.stride(0) if x0.dim() == 2 else 0  # the bias: the same row for every sentence
        h, cell = wx.new_empty(B, H), c.new_empty(B, H)
        bf16 = int(wx.dtype == torch.bfloat16)
        addresses = (wx.data_ptr(), c.data_ptr(), cell.data_ptr(), h.data_ptr(), 0, 0, 0, 0)
        kernel(0, bf16, x0.data_ptr(), stride, *addresses, B, H)
        ctx.save_for_backward(x0, wx, c, cell)
        ctx.kernel, ctx.stride = kernel, stride
        ctx.set_materialize_grads(False)
        return h, cell

    @staticmethod
    def backward(ctx, dh: Tensor | None, dcell: Tensor | None):
        x0, wx, c, cell = ctx.saved_tensors
        B, H = c.shape
        dh = None if dh is None else dh.to(wx.dtype).contiguous()
        dcell = None if dcell is None else dcell.float().contiguous()
        dz, dc = c.new_empty(B, 4 * H), c.new_empty(B, H)
        bf16 = int(wx.dtype == torch.bfloat16)
        addresses = map(address, (wx, c, cell, None, dh, dcell, dz, dc))
        ctx.kernel(1, bf16, x0.data_ptr(), ctx.stride, *addresses, B, H)
        dx0 = (dz if x0.dim() == 2 else dz.sum(0)) if ctx.needs_input_grad[0] else None
        dwx = dz.to(wx.dtype) if ctx.needs_input_grad[1] else None
        return dx0, dwx, (dc if ctx.needs_input_grad[2] else None), None
