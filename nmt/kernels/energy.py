"""The additive attention energy v^T tanh(q + k), computed in cache-sized pieces with its own backward.

Written plainly, `v(tanh(q[:, :, None] + keys[:, None]))` builds a (B, T, S, A) tensor, a second one for
the tanh, and keeps the tanh for the backward pass: at every decoder step of a long input that is tens of
megabytes written to fresh memory (page faults included), read back, and held until the backward runs.
`additive_energy` computes the same numbers piece by piece: for a few (sentence, step) rows at a time it
forms q + k in one reused buffer of about a megabyte, applies tanh in place and reduces it with v, so the
(B, T, S, A) tensor never exists. It saves only its inputs; the backward recomputes the tanh piece by piece
(one more sigmoid, far cheaper than storing and re-reading it) and reduces it with matmuls where it can.
The piece's size is the device's (nmt.device_plan): a megabyte, in cache, on a CPU; on a GPU, where each
piece costs its operators' launches whatever its size, a whole decoder step in one piece.

A decoder loop scores the same keys once per step (query = the previous state, or input feeding). Autograd
would form a (B, S, A) keys gradient at every step and add them up; with the keys handed over as StepKeys
(`AdditiveAttention.for_steps`), each step's backward adds its share into one buffer, in place, and the keys'
gradient is formed once after the last step.

The tanh is computed as 2 sigmoid(2x) - 1: torch's CPU sigmoid kernel is several times faster than its tanh
kernel (fp32, one thread of an AVX2 AMD EPYC: 0.39 ns an element for the whole form against 2.74 for tanh;
`python scripts/elementwise_benchmark.py` measures yours), and the two differ by at most ~2e-7. The
forward pass folds the affine part into v (v^T tanh(x) = (2v)^T sigmoid(2x) - sum(v)) and the backward uses
tanh' = 4 w with w = sigma (1 - sigma), so no pass turns the sigmoids into tanh values.

The elementwise work runs in fp32 whatever the autocast dtype: fp32 keeps the scores as exact as the
unfused fp32 form (tested against it).

Where the run's plan uses attention_energy (nmt.plan: training on a CPU with a C++ compiler), the same
arithmetic runs as loops that torch.compile generates (the end of this file): the forward reduces each sigmoid
with v as it is computed, and a decoder step's backward adds its share of the keys' gradient inside the kernel,
where the eager pieces make nine passes over their buffer. Both are tested against the plain form.

    scores = additive_energy(q, keys, v)   # q (B, T, A), keys (B, S, A), v (A,) -> (B, T, S) fp32

Shapes: B batch, T query steps, S source length, A attention size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from nmt.device_plan import work_sizes
from nmt.kernels.compiled import compiled
from nmt.kernels.stepweight import StepWeight, share


def _pieces(B: int, T: int, S: int, A: int, chunk: int):
    """(b0, b1, t0, t1) blocks covering B x T with about `chunk` elements of (S, A) work each."""
    rows = max(1, chunk // (S * A))  # (sentence, step) rows per piece
    tc = min(T, rows)
    bc = max(1, rows // tc)
    for b0 in range(0, B, bc):
        for t0 in range(0, T, tc):
            yield b0, min(B, b0 + bc), t0, min(T, t0 + tc)


def _buffer(q: Tensor, S: int, chunk: int) -> Tensor:
    """Room for the largest piece of _pieces (at least one (S, A) row, at most the whole B x T x S x A)."""
    B, T, A = q.shape
    return q.new_empty(min(B * T * S * A, max(chunk, S * A)))


def _sigmoids(buf: Tensor, q2: Tensor, keys: Tensor, b0: int, b1: int, t0: int, t1: int) -> Tensor:
    """sigmoid(2 (q + k)) for one piece, from q2 = 2q, in `buf`'s memory: (b1 - b0, t1 - t0, S, A) fp32."""
    out = buf[: (b1 - b0) * (t1 - t0) * keys.size(1) * keys.size(2)].view(b1 - b0, t1 - t0, keys.size(1), -1)
    torch.add(q2[b0:b1, t0:t1, None, :], keys[b0:b1, None], alpha=2, out=out)  # (b, t, S, A) 2q + 2k
    return out.sigmoid_()


class _KeySums:
    """What the keys' gradient needs, summed over the decoder steps that score one batch's keys (filled
    during backward): dE/dk[b, s] = 4 v * sum_t g[b, t, s] w[b, t, s] with w = sigma (1 - sigma). A step may
    score the keys of the first sentences only (StepKeys.rows: the sentences still being decoded); its sums
    go into those rows."""

    def __init__(self, shape: torch.Size):
        self.shape = shape  # (B, S, A): every sentence's keys
        self.g_w: Tensor | None = None  # (B, S, A)  sum_t g * w
        self.v: Tensor | None = None  # (A,)

    def start(self, keys: Tensor, v: Tensor) -> None:
        """Make room at the first call's backward (later calls add into it)."""
        if self.g_w is None:
            self.g_w, self.v = keys.new_zeros(self.shape), v

    def add_piece(self, b0: int, b1: int, g: Tensor, w: Tensor) -> None:
        """One piece's g (b, t, S) and w (b, t, S, A) (w is overwritten when t > 1)."""
        if g.size(1) == 1:
            self.g_w[b0:b1].addcmul_(g[:, 0, :, None], w[:, 0])
        else:
            self.g_w[b0:b1] += w.mul_(g[..., None]).sum(dim=1)

    def gradient(self) -> Tensor:
        return 4 * self.v * self.g_w  # (B, S, A)

    def take_gradient(self) -> Tensor | None:
        """The keys' gradient from every step (None if no step recorded one); the sums are let go."""
        if self.g_w is None:
            return None
        grad = self.gradient()
        self.g_w = self.v = None
        return grad


class StepKeys(NamedTuple):
    """The additive attention's keys (B, S, A) for the steps of one batch: each step's backward adds its part
    of the keys' gradient into one buffer, in place, where autograd would form a (B, S, A) gradient per step
    and add it up. `query`, when given, is the query projection W_s for those steps (nmt.kernels.stepweight: its
    gradient one matmul over all steps, where nn.Linear forms and adds a (A, Q) gradient per step);
    `exp_keys`, when given, exp(-2 keys) for the C++ step kernel (nmt.kernels.additive_step.factored_keys)."""

    keys: Tensor
    sums: _KeySums
    query: StepWeight | None = None
    exp_keys: Tensor | None = None

    @classmethod
    def of(
        cls, keys: Tensor, query: StepWeight | None = None, exp_keys: Callable[[Tensor], Tensor | None] | None = None
    ) -> Tensor | StepKeys:
        """The keys (B, S, A) in fp32 for a loop's steps (the plain tensor when no gradient is needed), with W_s
        and exp_keys(keys) (a function: not called then)."""
        keys = keys.float().contiguous()
        if not (torch.is_grad_enabled() and keys.requires_grad):
            return keys
        sums = _KeySums(keys.shape)
        return cls(share(keys, sums.take_gradient), sums, query, exp_keys(keys) if exp_keys else None)

    def rows(self, n: int) -> StepKeys:
        """The keys of the first n sentences (a view), summing their gradient into the same buffer."""
        if n == self.keys.size(0):
            return self
        exp_keys = None if self.exp_keys is None else self.exp_keys[:n]
        return StepKeys(self.keys[:n], self.sums, self.query, exp_keys)


class _AdditiveEnergy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, keys: Tensor, v: Tensor, sums: _KeySums | None) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            return _AdditiveEnergy._forward(ctx, q, keys, v, sums)

    @staticmethod
    def _forward(ctx, q: Tensor, keys: Tensor, v: Tensor, sums: _KeySums | None) -> Tensor:
        ctx.save_for_backward(q, keys, v)
        ctx.sums = sums
        scores = q.new_empty(q.size(0), q.size(1), keys.size(1))  # (B, T, S)
        if not _compiled_scores(scores, q, keys, v):
            _eager_scores(scores, q, keys, v)
        return scores

    @staticmethod
    def backward(ctx, grad: Tensor):
        with torch.autocast(grad.device.type, enabled=False):
            return _AdditiveEnergy._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad: Tensor):
        """With sigma = sigmoid(2 (q + k)), tanh = 2 sigma - 1 and tanh' = 4 w, w = sigma (1 - sigma):
        dE/dv = 2 sum g sigma - sum g, dE/dq = 4 v sum_s g w, dE/dk = 4 v sum_t g w."""
        q, keys, v = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        need_k = need_k or ctx.sums is not None
        grad = grad.contiguous()
        grad_q = torch.empty_like(q) if need_q else None  # every piece writes its own block
        g_sigma = torch.zeros_like(v) if need_v else None  # sum g sigma
        sums = ctx.sums if ctx.sums is not None else _KeySums(keys.shape) if need_k else None
        if sums is not None:
            sums.start(keys, v)
        if not _compiled_gradients(grad, q, keys, v, grad_q, g_sigma, sums):
            _eager_gradients(grad, q, keys, v, grad_q, g_sigma, sums)
        grad_v = g_sigma.mul_(2).sub_(grad.sum()) if need_v else None
        grad_k = sums.gradient() if sums is not None and ctx.sums is None else None
        return grad_q, grad_k, grad_v, None


def _eager_scores(scores: Tensor, q: Tensor, keys: Tensor, v: Tensor) -> None:
    """The scores (B, T, S) into `scores`, piece by piece through one reused buffer."""
    B, T, A = q.shape
    S, chunk = keys.size(1), work_sizes(q.device).energy_elements
    buf, q2 = _buffer(q, S, chunk), 2 * q
    v2, v_sum = 2 * v, v.sum()  # v^T tanh(x) = (2v)^T sigmoid(2x) - sum(v)
    for b0, b1, t0, t1 in _pieces(B, T, S, A, chunk):
        sig = _sigmoids(buf, q2, keys, b0, b1, t0, t1)  # (b, t, S, A)
        scores[b0:b1, t0:t1] = torch.mv(sig.view(-1, A), v2).sub_(v_sum).view(b1 - b0, t1 - t0, S)


def _eager_gradients(grad, q, keys, v, grad_q, g_sigma, sums) -> None:
    """Piece by piece: the sums over s are matmuls, the sums over t in-place additions (_KeySums)."""
    B, T, A = q.shape
    S, chunk = keys.size(1), work_sizes(q.device).energy_elements
    buf, q2, v4 = _buffer(q, S, chunk), 2 * q, 4 * v
    for b0, b1, t0, t1 in _pieces(B, T, S, A, chunk):
        sig = _sigmoids(buf, q2, keys, b0, b1, t0, t1)  # (b, t, S, A)
        g = grad[b0:b1, t0:t1]  # (b, t, S)
        if g_sigma is not None:
            g_sigma.addmv_(sig.view(-1, A).t(), g.reshape(-1))  # sum g sigma
        w = sig.addcmul_(sig, sig, value=-1)  # sigma - sigma^2, in place
        if grad_q is not None:
            g_w = torch.bmm(g.reshape(-1, 1, S), w.view(-1, S, A)).view(b1 - b0, t1 - t0, A)  # sum_s g w
            torch.mul(g_w, v4, out=grad_q[b0:b1, t0:t1])
        if sums is not None:
            sums.add_piece(b0, b1, g, w)


# ---------------------------------------------------------------------------------- compiled kernels
# The same arithmetic written for torch.compile (nmt.kernels.compiled), which turns each function into a few loops
# that do every step per element: the forward never stores the sigmoids, the backward once. A decoder loop
# calls the energy one step at a time (T = 1): its functions drop the T axis, so that the keys' sum over
# steps is an in-place addition inside the kernel. Pieces of at most COMPILED_CHUNK_ELEMENTS bound what the
# backward stores.

COMPILED_CHUNK_ELEMENTS = 1 << 22  # a piece's (rows, S, A) sigmoids in the backward: 16 MiB in fp32


def _scores_math(q: Tensor, keys: Tensor, v: Tensor) -> Tensor:
    """(b, t, A), (b, S, A), (A,) -> (b, t, S): (2v)^T sigmoid(2 (q + k)) - sum(v)."""
    sig = torch.sigmoid(2 * (q[:, :, None, :] + keys[:, None, :, :]))
    return (sig * (2 * v)).sum(-1) - v.sum()


def _step_scores_math(q: Tensor, keys: Tensor, v: Tensor) -> Tensor:
    """One step: (b, A), (b, S, A), (A,) -> (b, S)."""
    sig = torch.sigmoid(2 * (q[:, None, :] + keys))
    return (sig * (2 * v)).sum(-1) - v.sum()


def _gradient_math(q: Tensor, keys: Tensor, g: Tensor, g_w_keys: Tensor) -> tuple[Tensor, Tensor]:
    """For g (b, t, S): adds sum_t g w into g_w_keys (b, S, A) in place; returns sum_s g w (b, t, A) and
    sum_{t, s} g sigma (b, A)."""
    sig = torch.sigmoid(2 * (q[:, :, None, :] + keys[:, None, :, :]))
    g_sig = g[..., None] * sig
    g_w = g_sig - g_sig * sig  # g sigma (1 - sigma)
    g_w_keys.add_(g_w.sum(1))
    return g_w.sum(2), g_sig.sum((1, 2))


def _step_gradient_math(q: Tensor, keys: Tensor, g: Tensor, g_w_keys: Tensor) -> tuple[Tensor, Tensor]:
    """One step, g (b, S): adds g w into g_w_keys (b, S, A) in place; returns sum_s g w and sum_s g sigma,
    (b, A) each."""
    sig = torch.sigmoid(2 * (q[:, None, :] + keys))
    g_sig = g[..., None] * sig
    g_w = g_sig - g_sig * sig
    g_w_keys.add_(g_w)
    return g_w.sum(1), g_sig.sum(1)


def _compiled_scores(scores: Tensor, q: Tensor, keys: Tensor, v: Tensor) -> bool:
    """The scores through the compiled kernels; False (nothing written) when the kernels are eager."""
    B, T, A = q.shape
    step = T == 1
    fn = compiled(_step_scores_math if step else _scores_math)
    if fn is None or q.device.type != "cpu":
        return False
    for b0, b1, t0, t1 in _pieces(B, T, keys.size(1), A, COMPILED_CHUNK_ELEMENTS):
        piece = fn(q[b0:b1, 0], keys[b0:b1], v) if step else fn(q[b0:b1, t0:t1], keys[b0:b1], v)
        if piece is None:  # compiling failed: the kernels are eager now (nmt.kernels.compiled)
            return False
        scores[b0:b1, t0:t1] = piece.view(b1 - b0, t1 - t0, -1)
    return True


def _compiled_gradients(grad, q, keys, v, grad_q, g_sigma, sums) -> bool:
    """The backward's sums through the compiled kernels; False (nothing written) when the kernels are eager."""
    B, T, A = q.shape
    step = T == 1
    fn = compiled(_step_gradient_math if step else _gradient_math)
    if fn is None or q.device.type != "cpu":
        return False
    v4 = 4 * v
    for b0, b1, t0, t1 in _pieces(B, T, keys.size(1), A, COMPILED_CHUNK_ELEMENTS):
        g_w_keys = sums.g_w[b0:b1] if sums is not None else torch.zeros_like(keys[b0:b1])  # (b, S, A)
        g = grad[b0:b1, t0:t1]
        out = fn(q[b0:b1, 0], keys[b0:b1], g[:, 0], g_w_keys) if step else fn(q[b0:b1, t0:t1], keys[b0:b1], g, g_w_keys)
        if out is None:
            if (b0, t0) != (0, 0):  # earlier pieces have added into the keys' sums: eager would add them again
                raise RuntimeError("the compiled additive energy failed part way through a backward pass")
            return False
        g_w_s, g_sig = out
        if grad_q is not None:
            torch.mul(g_w_s.view(b1 - b0, t1 - t0, A), v4, out=grad_q[b0:b1, t0:t1])
        if g_sigma is not None:
            g_sigma += g_sig.sum(0)
    return True


def additive_energy(q: Tensor, keys: Tensor | StepKeys, v: Tensor) -> Tensor:
    """v^T tanh(q_t + k_s) for every query step t and source position s: (B, T, A), (B, S, A), (A,) -> (B, T, S).

    Computed in fp32 (inputs are cast), in pieces, with a backward that recomputes the sigmoids. With StepKeys
    (a decoder loop calling this once per step), the keys' gradient is summed in place over the steps."""
    keys, sums = (keys.keys, keys.sums) if isinstance(keys, StepKeys) else (keys.float().contiguous(), None)
    return _AdditiveEnergy.apply(q.float().contiguous(), keys, v.float(), sums)
