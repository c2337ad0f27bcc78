"""The training loss: label-smoothed cross-entropy summed over real target tokens, written out.

loss_sum, n_tokens = token_loss(logits, batch.tgt_out, label_smoothing=0.1)   # logits (B, T, V)
(loss_sum / n_tokens).backward()

Training skips the padded target positions before the output layer (the largest matmuls of a step and the
loss's passes over V): rows = loss_rows(batch.tgt_out) lists the positions to score, and

    logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in, rows)        # (N, V)
    loss_sum, n_tokens = token_loss(logits, batch.tgt_out.reshape(-1)[rows], 0.1)

gives the same loss. N is the real tokens rounded up to a multiple of LOSS_ROW_MULTIPLE with padded
positions (which the loss ignores), so that batches share a few row counts: on a CPU with bf16 hardware
every new matmul shape costs a kernel compilation (nmt/memory.py). `rows_of_lengths` gives the same rows from
the batch's target lengths, on the host: nothing is read back from the device (a GPU's step then never waits).

The training step, which knows its token count from the batch, takes `loss_sum` (token_loss without the count).
How many rows one call of the loss takes is the device's choice (nmt.device_plan: cache-sized pieces on a CPU,
all rows at once on a GPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.device_plan import work_sizes
from nmt.kernels import step_gemm
from nmt.kernels.compiled import is_in_torch_dispatch_mode
from nmt.kernels.smoothed_xent import smoothed_xent
from nmt.shapes import ROW_MULTIPLE, padded_count
from nmt.special import PAD_ID

LOSS_ROW_MULTIPLE = ROW_MULTIPLE  # loss_rows: row counts rounded up to this (a few shapes rather than one per batch)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of logits (N, V) against target (N,), skipping PAD targets.

    loss_n = (1 - eps) * (lse_n - x_n[y_n]) + eps * (lse_n - mean_v x_n[v]), lse_n = logsumexp_v x_n[v],
    the same value as F.cross_entropy(..., label_smoothing=eps, reduction="sum"). Written out because its
    gradient is one expression, softmax(x) - (1 - eps) onehot(y) - eps / V, computed in place, where
    autograd's log_softmax/nll path takes about twice as many passes over the logits. Both directions work
    through the logits in pieces of the device's loss_rows (nmt.device_plan): on a CPU 16 rows, each converted
    to fp32 in a small buffer that stays in cache, so no fp32 copy of the (N, V) logits (tens of megabytes,
    written to fresh pages) is ever made; on a GPU all rows in one piece, a few operators whatever the batch.
    Everything is computed in fp32, whatever the dtype of the logits.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float) -> Tensor:
        real = target != PAD_ID  # (N,)
        N, V = logits.shape
        lse, picked = logits.new_empty(N, dtype=torch.float32), logits.new_empty(N, dtype=torch.float32)
        mean = logits.new_empty(N, dtype=torch.float32) if eps else None
        piece = work_sizes(logits.device).loss_rows or max(N, 1)
        for r0 in range(0, N, piece):
            r1 = min(N, r0 + piece)
            x = logits[r0:r1].float()  # (rows, V)
            torch.logsumexp(x, dim=-1, out=lse[r0:r1])
            torch.gather(x, 1, target[r0:r1, None], out=picked[r0:r1, None])
            if eps:
                torch.mean(x, dim=-1, out=mean[r0:r1])
        loss = (1 - eps) * (lse - picked)
        if eps:
            loss = loss + eps * (lse - mean)
        ctx.save_for_backward(logits, target, lse, real)
        ctx.eps = eps
        return loss.masked_fill(~real, 0.0).sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, target, lse, real = ctx.saved_tensors
        eps, (N, V) = ctx.eps, logits.shape
        scale = grad * real  # (N,)
        out = torch.empty_like(logits)
        in_place = out.dtype == torch.float32  # fp32 logits: each piece is computed where it goes, no copy
        piece = work_sizes(logits.device).loss_rows or max(N, 1)
        for r0 in range(0, N, piece):
            r1 = min(N, r0 + piece)
            g = torch.sub(logits[r0:r1], lse[r0:r1, None], out=out[r0:r1] if in_place else None)
            g.exp_()  # (rows, V) fp32: the softmax
            if eps:
                g.sub_(eps / V)
            g.scatter_add_(1, target[r0:r1, None], g.new_full((r1 - r0, 1), -(1 - eps)))
            g.mul_(scale[r0:r1, None])
            if not in_place:
                out[r0:r1] = g  # to the logits' dtype
        return out, None, None


class _OutputLayerCrossEntropy(torch.autograd.Function):
    """loss_sum(F.linear(hidden, weight, bias), target, eps) with the output layer inside, in fp32: the logits are
    made `rows` at a time in one buffer, and each piece's gradient (softmax - (1 - eps) onehot - eps / V, zero on
    PAD targets) is multiplied into the gradients of hidden, weight and bias at once, in the forward pass. So
    the (N, V) logits and their gradient (54 MB each on the multi30k_deen preset, written to fresh pages every
    step) never exist, and the backward only scales the three gradients by the incoming one (the loss is the
    end of the graph: its gradient is a number). Costs the same matmuls as the layer and the loss apart. Where
    the compiled kernels run, each piece's loss and gradient, the bias added, is one C++ call
    (nmt.kernels.smoothed_xent)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor, target: Tensor, eps: float, rows: int):
        N, V = hidden.size(0), weight.size(0)
        real = target != PAD_ID  # (N,)
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.empty_like(weight)  # (N, H), (V, H)
        grad_bias = torch.zeros_like(bias)  # (V,)
        buffer, losses = hidden.new_empty(min(rows, N), V), hidden.new_empty(N)  # losses: each row's
        target = target.contiguous()
        if N == 0:
            grad_weight.zero_()
        # W^T in nmt.kernels.step_gemm's panels once for all pieces, where the compiled kernels run (torch.mm lays
        # the 16 MB weight out again for every piece); not under a FLOP counter's dispatch mode
        panels = (
            None
            if N <= rows or is_in_torch_dispatch_mode()
            else step_gemm.pack(weight, backward=False, component="output_loss")
        )
        for r0 in range(0, N, rows):
            r1 = min(N, r0 + rows)
            if panels is None:
                z = torch.mm(hidden[r0:r1], weight.t(), out=buffer[: r1 - r0])  # (rows, V) logits but the bias
            else:
                z = step_gemm.product(hidden[r0:r1], panels.forward, V, panels.kernel, out=buffer[: r1 - r0])
            # one C++ call where it runs, the bias's gradient summed in it
            if not smoothed_xent(z, bias, target[r0:r1], losses[r0:r1], eps, PAD_ID, grad_bias):
                _loss_and_gradient(z.add_(bias), target[r0:r1], real[r0:r1], losses[r0:r1], eps)
                grad_bias += z.sum(0)
            torch.mm(z, weight, out=grad_hidden[r0:r1])
            if r0 == 0:  # the first piece's product is the gradient (no zero-filled 16 MB to add it to)
                torch.mm(z.t(), hidden[r0:r1], out=grad_weight)
            else:
                torch.addmm(grad_weight, z.t(), hidden[r0:r1], out=grad_weight)  # (not addmm_: FLOP counters see it)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.used = False
        return losses.sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        # scaled in place (the gradients are made for this one backward: a fresh 16 MB product costs page faults)
        if ctx.used:
            raise RuntimeError("the fused output layer and loss (nmt.loss.output_loss_sum) backpropagate once only")
        ctx.used = True
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return grad_hidden.mul_(grad), grad_weight.mul_(grad), grad_bias.mul_(grad), None, None, None


def _loss_and_gradient(z: Tensor, target: Tensor, real: Tensor, losses: Tensor, eps: float) -> None:
    """nmt.kernels.smoothed_xent in torch operations: the logits z (R, V) fp32 become the gradient of their
    label-smoothed cross-entropy (zero on PAD targets, `real` False) and each row's loss goes to losses (R,), in
    cache-sized pieces (nmt.device_plan: loss_rows), each read and rewritten while it is hot."""
    R, V = z.shape
    piece = work_sizes(z.device).loss_rows or R
    minus_target = z.new_full((min(piece, R), 1), -(1 - eps))  # what each row's target takes off its softmax
    for p0 in range(0, R, piece):
        p1 = min(R, p0 + piece)
        g, y, keep = z[p0:p1], target[p0:p1, None], real[p0:p1, None]
        lse = torch.logsumexp(g, dim=-1, keepdim=True)  # (piece, 1)
        loss = (1 - eps) * (lse - g.gather(1, y))
        if eps:
            loss += eps * (lse - g.mean(dim=-1, keepdim=True))
        losses[p0:p1] = loss.masked_fill(~keep, 0.0).squeeze(1)
        g.sub_(lse).exp_()  # the softmax
        if eps:
            g.sub_(eps / V)
        g.scatter_add_(1, y, minus_target[: p1 - p0])
        g.mul_(keep)


OUTPUT_ROWS = 512  # output_loss_sum: rows of logits made at a time (a 16 MB buffer for 8,000 words)


def output_loss_sum(hidden: Tensor, output: torch.nn.Linear, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """loss_sum(output(hidden), target, label_smoothing) without the (N, V) logits: hidden (N, H) fp32 (the
    output layer's input at the loss's rows), target (N,) -> () fp32. For fp32 training on a CPU, where the
    trainer uses it; under autocast and on a GPU the logits are made whole (loss_sum)."""
    return _OutputLayerCrossEntropy.apply(
        hidden, output.weight, output.bias, target.reshape(-1), float(label_smoothing), OUTPUT_ROWS
    )


def token_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> tuple[Tensor, int]:
    """Summed cross-entropy over real target tokens (padding ignored) and their count.

    Divide the sum by the count (over a whole accumulated batch) for the per-token loss.
    Computed in fp32 whatever the autocast dtype.
    """
    n_real = int((target != PAD_ID).sum())
    return loss_sum(logits, target, label_smoothing), n_real


def loss_sum(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """token_loss's sum alone, with no count read from the device: logits (..., V), target (...) -> () fp32."""
    V = logits.size(-1)
    return _SmoothedCrossEntropy.apply(logits.reshape(-1, V), target.reshape(-1), float(label_smoothing))


def loss_rows(target: Tensor, multiple: int = LOSS_ROW_MULTIPLE) -> Tensor:
    """Flat indices (N,) into `target` (B, T), ascending: every real token, then padded positions (the first
    ones) until N is a multiple of `multiple`, or all B x T positions if there are not that many."""
    flat = target.reshape(-1)
    padding = (flat == PAD_ID).to(torch.int8)
    n_real = flat.numel() - int(padding.sum())
    n = min(flat.numel(), padded_count(n_real, multiple))
    return torch.argsort(padding, stable=True)[:n].sort().values


def rows_of_lengths(lengths: Tensor, T: int, multiple: int = LOSS_ROW_MULTIPLE) -> Tensor:
    """loss_rows of a target (B, T) whose sentence b has lengths[b] real tokens and padding after them, from the
    lengths (B,) alone: on the host, without the target's values."""
    real = (torch.arange(T) < lengths[:, None]).reshape(-1)  # (B T,)
    n_real = int(lengths.sum())
    n = min(real.numel(), padded_count(n_real, multiple))
    return torch.cat([real.nonzero().flatten(), (~real).nonzero().flatten()[: n - n_real]]).sort().values
