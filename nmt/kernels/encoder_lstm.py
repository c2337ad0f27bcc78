"""The encoder's one-layer (bi)LSTM in fp32 on a CPU, its two directions on two threads at once.

    out, (h_n, c_n) = encoder_lstm(rnn, x)   # as rnn(x) for an unpacked batch_first (B, S, E) batch, or None

nn.LSTM's CPU kernel (oneDNN's) runs the two directions one after the other, each step's small product of about
a hundred rows by W_hh split between the threads, where two threads gain little on so few rows. Here the
input's projection for every step and both directions is one large matmul, then each direction runs its steps
on a thread of its own (nmt/kernels/csrc/encoder_lstm.cpp: W_hh packed once per batch in panels, the cell's
elementwise part from nmt/kernels/csrc/lstm_cell.h), and the backward ends in large matmuls again: the gates'
gradients of all steps times the inputs and the states. The arithmetic is nn.LSTM's on its own parameters
(tested against it); the sums run in another order.

It runs where the run's plan uses it (the component `encoder`, nmt.plan: auto takes it for one bidirectional
fp32 CPU layer at any thread count) on an fp32 CPU batch, one layer with biases and no projection, from a zero
initial state; elsewhere it returns None (a call it does not take is logged once: nmt.kernels.compiled.fallback)
and the caller runs nn.LSTM. With two directions and two threads or more each direction runs on a thread of its
own; on one thread they run one after the other.

Shapes: B batch, S steps, E input size, H hidden size, D directions, G = 4H gates.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from nmt.kernels import step_gemm
from nmt.kernels.compiled import address, cpp_kernel, fallback, is_in_torch_dispatch_mode

SOURCE = Path(__file__).parent / "csrc" / "encoder_lstm.cpp"
ARGTYPES = ["int64_t", "int64_t", *["uintptr_t"] * 10, *["int64_t"] * 4]
FORWARD, BACKWARD, WIDTH = 0, 1, 2  # the kernel's first argument


def encoder_lstm(rnn: nn.LSTM, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]] | None:
    """rnn(x) for x (B, S, E) batch_first: (out (B, S, D H), (h_n, c_n) (D, B, H)), or None where it does not
    apply (see the module docstring)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 3:
        return fallback("encoder", "not a (B, S, E) fp32 CPU batch")
    if x.size(0) == 0 or x.size(1) == 0:
        return fallback("encoder", "an empty batch")
    if not rnn.batch_first or rnn.num_layers != 1 or not rnn.bias or rnn.proj_size:
        return fallback("encoder", "not one batch-first layer with biases and no projection")
    if is_in_torch_dispatch_mode():
        return fallback("encoder", "under a torch dispatch mode (a FLOP counter)")
    if torch.is_autocast_enabled("cpu") or any(p.dtype != torch.float32 for p in rnn.parameters()):
        return fallback("encoder", "under autocast or with parameters not in fp32")
    kernel = cpp_kernel(SOURCE, ARGTYPES, "encoder")
    if kernel is None:
        return None
    if _width(kernel) != step_gemm.width("encoder"):
        return fallback("encoder", "its panels' width differs from step_gemm's (another build)")
    threads = torch.get_num_threads()
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    suffixes = ["", "_reverse"] if rnn.bidirectional else [""]
    params = [getattr(rnn, f"{name}_l0{sfx}") for sfx in suffixes for name in names]  # per direction, in order
    out, h_n, c_n = _EncoderLSTM.apply(x, kernel, threads, *params)
    return out.transpose(0, 1), (h_n, c_n)  # (B, S, D H): a view of the time-major states


class _EncoderLSTM(torch.autograd.Function):
    """Forward: xw = x W_ih^T + b (both directions), the steps in C++. Backward: the steps in C++ give dz (the
    gates' gradients, S, B, D G); the rest is large matmuls over dz."""

    @staticmethod
    def forward(ctx, x: Tensor, kernel, threads: int, *params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, S, E = x.shape
        D, H = len(params) // 4, params[1].size(1)
        G = 4 * H
        w_ih = torch.cat(params[0::4])  # (D G, E)
        bias = torch.cat([b_ih + b_hh for b_ih, b_hh in zip(params[2::4], params[3::4], strict=True)])  # (D G,)
        xt = x.detach().transpose(0, 1).contiguous()  # (S, B, E)
        xw = torch.addmm(bias, xt.view(S * B, E), w_ih.t())  # (S B, D G)
        w_hh = [p.detach() for p in params[1::4]]  # (G, H) each
        forward_panels = [step_gemm.pack(w, backward=False, component="encoder").forward for w in w_hh]  # K H, N G
        cells, out, zeros = x.new_empty(D, S, B, H), x.new_empty(S, B, D * H), x.new_zeros(max(B * H, G))
        buffers = (xw, _table(forward_panels), zeros, cells, out)
        kernel(FORWARD, threads, *map(address, buffers), *[0] * 5, S, B, H, D)  # xw += h W_hh^T: then z
        last = [S - 1, 0][:D]  # where each direction's final state stands
        h_n = torch.stack([out[t, :, d * H : (d + 1) * H] for d, t in enumerate(last)])  # (D, B, H)
        c_n = torch.stack([cells[d, t] for d, t in enumerate(last)])  # (D, B, H)
        ctx.save_for_backward(xt, xw, cells, out, w_ih, *w_hh)
        ctx.kernel, ctx.threads = kernel, threads
        ctx.set_materialize_grads(False)
        return out, h_n, c_n

    @staticmethod
    def backward(ctx, d_out: Tensor | None, d_hn: Tensor | None, d_cn: Tensor | None):
        xt, z, cells, out, w_ih, *w_hh = ctx.saved_tensors
        S, B, E = xt.shape
        D, H = len(w_hh), w_hh[0].size(1)
        G = 4 * H
        backward_panels = [step_gemm.pack(w, forward=False, component="encoder").backward for w in w_hh]  # K G, N H
        grads = [None if g is None else g.float().contiguous() for g in (d_out, d_hn, d_cn)]
        dz, scratch = xt.new_empty(S, B, D * G), xt.new_empty(D, 2 * B * H + G)  # scratch: then the bias's gradient
        zeros = xt.new_zeros(max(B * H, G))
        buffers = (z, _table(backward_panels), zeros, cells, out, *grads, scratch, dz)
        ctx.kernel(BACKWARD, ctx.threads, *map(address, buffers), S, B, H, D)
        dz2 = dz.view(S * B, D * G)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.mm(dz2, w_ih).view(S, B, E).transpose(0, 1)  # (B, S, E)
        d_w_ih = torch.mm(dz2.t(), xt.view(S * B, E))  # (D G, E)
        d_bias = scratch[:, 2 * B * H :].reshape(D * G)  # (D G,): dz's column sums, the kernel's
        grads_out = []
        for d in range(D):
            # W_hh's gradient: dz_t h_{t-1}^T over the steps after the first of direction d
            later, earlier = (slice(1, S), slice(0, S - 1)) if d == 0 else (slice(0, S - 1), slice(1, S))
            dz_d = dz[later].view(-1, D * G)[:, d * G : (d + 1) * G]  # ((S-1) B, G), rows D G apart
            h_d = out[earlier].view(-1, D * H)[:, d * H : (d + 1) * H]  # ((S-1) B, H)
            d_w_hh = torch.mm(dz_d.t(), h_d) if S > 1 else w_hh[d].new_zeros(G, H)
            db = d_bias[d * G : (d + 1) * G]
            grads_out += [d_w_ih[d * G : (d + 1) * G], d_w_hh, db, db.clone()]  # b_ih and b_hh: the same sum
        return (dx, None, None, *grads_out)


def _table(panels: list[Tensor]) -> Tensor:
    """The panels' addresses in one int64 tensor, for the kernel's `panels` argument (kept alive by the caller's
    list)."""
    return torch.tensor([p.data_ptr() for p in panels], dtype=torch.int64)


_widths: dict[Callable, int] = {}


def _width(kernel: Callable) -> int:
    """NR, the panels' columns this kernel reads: the same as step_gemm's, which packs them (one build's flags)."""
    if kernel not in _widths:
        nr = torch.zeros(1, dtype=torch.long)
        kernel(WIDTH, 0, nr.data_ptr(), *[0] * 13)
        _widths[kernel] = int(nr)
    return _widths[kernel]
