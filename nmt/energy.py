"""The additive attention energy v^T tanh(q + k), computed in cache-sized pieces with its own backward.

Written plainly, `v(tanh(q[:, :, None] + keys[:, None]))` builds a (B, T, S, A) tensor, a second one for
the tanh, and keeps the tanh for the backward pass: at every decoder step of a long input that is tens of
megabytes written to fresh memory (page faults included), read back, and held until the backward runs.
`additive_energy` computes the same numbers piece by piece: for a few (sentence, step) rows at a time it
forms q + k in one reused buffer of about a megabyte, applies tanh in place and reduces it with v, so the
(B, T, S, A) tensor never exists. It saves only its inputs; the backward recomputes the tanh piece by piece
(one more tanh, far cheaper than storing and re-reading it).

The elementwise work runs in fp32 whatever the autocast dtype: fp32 keeps the scores as exact as the
unfused fp32 form (tested against it), and on the CPUs measured so far bf16 tanh was not faster than fp32.

    scores = additive_energy(q, keys, v)   # q (B, T, A), keys (B, S, A), v (A,) -> (B, T, S) fp32

Shapes: B batch, T query steps, S source length, A attention size.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 18  # elements of one piece's (rows, S, A) buffer: 1 MiB in fp32, within a core's L2


def _pieces(B: int, T: int, S: int, A: int):
    """(b0, b1, t0, t1) blocks covering B x T with about CHUNK_ELEMENTS elements of (S, A) work each."""
    rows = max(1, CHUNK_ELEMENTS // (S * A))  # (sentence, step) rows per piece
    tc = min(T, rows)
    bc = max(1, rows // tc)
    for b0 in range(0, B, bc):
        for t0 in range(0, T, tc):
            yield b0, min(B, b0 + bc), t0, min(T, t0 + tc)


def _buffer(q: Tensor, S: int) -> Tensor:
    """Room for the largest piece of _pieces (at least one (S, A) row, at most the whole B x T x S x A)."""
    B, T, A = q.shape
    return q.new_empty(min(B * T * S * A, max(CHUNK_ELEMENTS, S * A)))


def _tanh_sum(buf: Tensor, q: Tensor, keys: Tensor, b0: int, b1: int, t0: int, t1: int) -> Tensor:
    """tanh(q + k) for one piece, in `buf`'s memory: (b1 - b0, t1 - t0, S, A) fp32."""
    out = buf[: (b1 - b0) * (t1 - t0) * keys.size(1) * keys.size(2)].view(b1 - b0, t1 - t0, keys.size(1), -1)
    torch.add(keys[b0:b1, None], q[b0:b1, t0:t1, None, :], out=out)  # (b, t, S, A)
    return out.tanh_()


class _AdditiveEnergy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, keys: Tensor, v: Tensor) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            return _AdditiveEnergy._forward(ctx, q, keys, v)

    @staticmethod
    def _forward(ctx, q: Tensor, keys: Tensor, v: Tensor) -> Tensor:
        B, T, A = q.shape
        S = keys.size(1)
        ctx.save_for_backward(q, keys, v)
        scores = q.new_empty(B, T, S)  # (B, T, S)
        buf = _buffer(q, S)
        for b0, b1, t0, t1 in _pieces(B, T, S, A):
            th = _tanh_sum(buf, q, keys, b0, b1, t0, t1)  # (b, t, S, A)
            scores[b0:b1, t0:t1] = torch.mv(th.view(-1, A), v).view(b1 - b0, t1 - t0, S)
        return scores

    @staticmethod
    def backward(ctx, grad: Tensor):
        with torch.autocast(grad.device.type, enabled=False):
            return _AdditiveEnergy._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad: Tensor):
        q, keys, v = ctx.saved_tensors
        B, T, A = q.shape
        S = keys.size(1)
        need_q, need_k, need_v = ctx.needs_input_grad
        grad = grad.contiguous()
        grad_q = torch.empty_like(q) if need_q else None  # every piece writes its own block
        grad_k = (torch.empty_like(keys) if T == 1 else torch.zeros_like(keys)) if need_k else None  # T > 1: sums
        grad_v = torch.zeros_like(v) if need_v else None
        buf = _buffer(q, S)
        gk_buf = buf.new_empty(buf.numel()) if T > 1 or not need_k else None
        for b0, b1, t0, t1 in _pieces(B, T, S, A):
            th = _tanh_sum(buf, q, keys, b0, b1, t0, t1)  # (b, t, S, A)
            g = grad[b0:b1, t0:t1, :, None]  # (b, t, S, 1)
            if need_v:
                grad_v.addmv_(th.view(-1, A).t(), g.reshape(-1))  # sum over (b, t, s) of g * tanh
            # d scores / d (q + k) = g * v * (1 - tanh^2), written where k's gradient goes when T = 1
            gk = grad_k[b0:b1, None] if gk_buf is None else gk_buf[: th.numel()].view_as(th)  # (b, t, S, A)
            torch.mul(g, v, out=gk)
            gk.addcmul_(gk, th.mul_(th), value=-1)
            if need_q:
                grad_q[b0:b1, t0:t1] = gk.sum(dim=2)
            if need_k and gk_buf is not None:
                grad_k[b0:b1] += gk.sum(dim=1)
        return grad_q, grad_k, grad_v


def additive_energy(q: Tensor, keys: Tensor, v: Tensor) -> Tensor:
    """v^T tanh(q_t + k_s) for every query step t and source position s: (B, T, A), (B, S, A), (A,) -> (B, T, S).

    Computed in fp32 (inputs are cast), in pieces, with a backward that recomputes the tanh."""
    return _AdditiveEnergy.apply(q.float().contiguous(), keys.float().contiguous(), v.float())
