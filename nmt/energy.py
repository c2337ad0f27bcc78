"""The additive attention energy v^T tanh(q + k), computed in cache-sized pieces with its own backward.

Written plainly, `v(tanh(q[:, :, None] + keys[:, None]))` builds a (B, T, S, A) tensor, a second one for
the tanh, and keeps the tanh for the backward pass: at every decoder step of a long input that is tens of
megabytes written to fresh memory (page faults included), read back, and held until the backward runs.
`additive_energy` computes the same numbers piece by piece: for a few (sentence, step) rows at a time it
forms q + k in one reused buffer of about a megabyte, applies tanh in place and reduces it with v, so the
(B, T, S, A) tensor never exists. It saves only its inputs; the backward recomputes the tanh piece by piece
(one more tanh, far cheaper than storing and re-reading it) and reduces it with matmuls where it can.

A decoder loop scores the same keys once per step (query = the previous state, or input feeding). Autograd
would form a (B, S, A) keys gradient at every step and add them up; with the keys handed over as StepKeys
(`AdditiveAttention.for_steps`), each step's backward adds its share into one buffer, in place, and the keys'
gradient is formed once after the last step.

The elementwise work runs in fp32 whatever the autocast dtype: fp32 keeps the scores as exact as the
unfused fp32 form (tested against it), and on the CPUs measured so far bf16 tanh was not faster than fp32.

    scores = additive_energy(q, keys, v)   # q (B, T, A), keys (B, S, A), v (A,) -> (B, T, S) fp32

Shapes: B batch, T query steps, S source length, A attention size.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from nmt.stepweight import share

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


class _KeySums:
    """What the keys' gradient needs, summed over the decoder steps that score one batch's keys (filled
    during backward): dE/dk[b, s] = v * (sum_t g[b, t, s] - sum_t g[b, t, s] tanh^2[b, t, s]). A step may score
    the keys of the first sentences only (StepKeys.rows: the sentences still being decoded); its sums go into
    those rows."""

    def __init__(self, shape: torch.Size):
        self.shape = shape  # (B, S, A): every sentence's keys
        self.g_tanh2: Tensor | None = None  # (B, S, A)  sum_t g * tanh^2
        self.g: Tensor | None = None  # (B, S)  sum_t g
        self.v: Tensor | None = None  # (A,)

    def add_call(self, grad: Tensor, keys: Tensor, v: Tensor) -> None:
        """Start (at the first call's backward) or go on summing: one call's upstream gradient (b, T, S),
        for the first b sentences."""
        if self.g is None:
            self.g_tanh2, self.g, self.v = keys.new_zeros(self.shape), grad.new_zeros(self.shape[:2]), v
        self.g[: grad.size(0)] += grad.sum(dim=1)

    def add_piece(self, b0: int, b1: int, g: Tensor, tanh2: Tensor) -> None:
        """One piece's g (b, t, S) and tanh^2 (b, t, S, A) (tanh2 is overwritten when t > 1)."""
        if g.size(1) == 1:
            self.g_tanh2[b0:b1].addcmul_(g[:, 0, :, None], tanh2[:, 0])
        else:
            self.g_tanh2[b0:b1] += tanh2.mul_(g[..., None]).sum(dim=1)

    def gradient(self) -> Tensor:
        return self.v * (self.g[..., None] - self.g_tanh2)  # (B, S, A)

    def take_gradient(self) -> Tensor | None:
        """The keys' gradient from every step (None if no step recorded one); the sums are let go."""
        if self.g is None:
            return None
        grad = self.gradient()
        self.g_tanh2 = self.g = self.v = None
        return grad


class StepKeys(NamedTuple):
    """The additive attention's keys (B, S, A) for the steps of one batch: each step's backward adds its part
    of the keys' gradient into one buffer, in place, where autograd would form a (B, S, A) gradient per step
    and add it up."""

    keys: Tensor
    sums: _KeySums

    @classmethod
    def of(cls, keys: Tensor) -> Tensor | StepKeys:
        keys = keys.float().contiguous()
        if not (torch.is_grad_enabled() and keys.requires_grad):
            return keys
        sums = _KeySums(keys.shape)
        return cls(share(keys, sums.take_gradient), sums)

    def rows(self, n: int) -> StepKeys:
        """The keys of the first n sentences (a view), summing their gradient into the same buffer."""
        return self if n == self.keys.size(0) else StepKeys(self.keys[:n], self.sums)


class _AdditiveEnergy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, keys: Tensor, v: Tensor, sums: _KeySums | None) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            return _AdditiveEnergy._forward(ctx, q, keys, v, sums)

    @staticmethod
    def _forward(ctx, q: Tensor, keys: Tensor, v: Tensor, sums: _KeySums | None) -> Tensor:
        B, T, A = q.shape
        S = keys.size(1)
        ctx.save_for_backward(q, keys, v)
        ctx.sums = sums
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
        """With th = tanh(q + k) and u = th^2: dE/dv = sum g th, dE/dq = v (sum_s g - sum_s g u),
        dE/dk = v (sum_t g - sum_t g u); the sums of g u are matmuls over s, or in-place sums over t."""
        q, keys, v = ctx.saved_tensors
        B, T, A = q.shape
        S = keys.size(1)
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        need_k = need_k or ctx.sums is not None
        grad = grad.contiguous()
        grad_q = torch.empty_like(q) if need_q else None  # every piece writes its own block
        grad_v = torch.zeros_like(v) if need_v else None
        sums = ctx.sums if ctx.sums is not None else _KeySums(keys.shape) if need_k else None
        if sums is not None:
            sums.add_call(grad, keys, v)
        g_sum_s = grad.sum(dim=2) if need_q else None  # (B, T)
        buf = _buffer(q, S)
        for b0, b1, t0, t1 in _pieces(B, T, S, A):
            th = _tanh_sum(buf, q, keys, b0, b1, t0, t1)  # (b, t, S, A)
            g = grad[b0:b1, t0:t1]  # (b, t, S)
            if need_v:
                grad_v.addmv_(th.view(-1, A).t(), g.reshape(-1))
            u = th.mul_(th)  # tanh^2
            if need_q:
                g_u = torch.bmm(g.reshape(-1, 1, S), u.view(-1, S, A)).view(b1 - b0, t1 - t0, A)  # sum_s g u
                grad_q[b0:b1, t0:t1] = v * (g_sum_s[b0:b1, t0:t1, None] - g_u)
            if sums is not None:
                sums.add_piece(b0, b1, g, u)
        grad_k = sums.gradient() if sums is not None and ctx.sums is None else None
        return grad_q, grad_k, grad_v, None


def additive_energy(q: Tensor, keys: Tensor | StepKeys, v: Tensor) -> Tensor:
    """v^T tanh(q_t + k_s) for every query step t and source position s: (B, T, A), (B, S, A), (A,) -> (B, T, S).

    Computed in fp32 (inputs are cast), in pieces, with a backward that recomputes the tanh. With StepKeys
    (a decoder loop calling this once per step), the keys' gradient is summed in place over the steps."""
    keys, sums = (keys.keys, keys.sums) if isinstance(keys, StepKeys) else (keys.float().contiguous(), None)
    return _AdditiveEnergy.apply(q.float().contiguous(), keys, v.float(), sums)
