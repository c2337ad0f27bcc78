"""The decoder's stacked LSTM written out one step at a time, with nn.LSTM's own parameters.

    layers = layer_params(decoder.rnn, embed_size, dtype)          # once per batch
    top, h, c = lstm_step(x0, [feed, context], h, c, layers, dropout)   # every decoder step

Written out rather than calling nn.LSTM once per step: the embeddings' share of layer 0's input is projected
for all steps in one matmul (x0 = W_x y + b, by the caller), the weights are cast once per batch under
autocast, and the weights used at every step get their gradient in one matmul over all steps
(nmt.stepweight). The arithmetic is nn.LSTM's (gates i, f, g, o), and checkpoints hold nn.LSTM's parameters.
Shapes: L layers, B batch, H hidden, E embedding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from nmt.stepweight import StepWeight


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
    for layer, p in enumerate(layers):
        inputs = recurrent if layer == 0 else [dropout(below)]
        gates = (x0 if layer == 0 else p.bias) + p.w_r(torch.cat([*inputs, h[layer]], dim=-1))  # (B, 4H)
        i, f, g, o = gates.chunk(4, dim=-1)
        cell = torch.sigmoid(f) * c[layer] + torch.sigmoid(i) * torch.tanh(g)
        below = (torch.sigmoid(o) * torch.tanh(cell)).to(p.w_r.weight.dtype)  # h in the matmul dtype
        hs.append(below)
        cs.append(cell)
    return below, torch.stack(hs), torch.stack(cs)
