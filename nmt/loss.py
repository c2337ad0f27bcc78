"""The training loss: label-smoothed cross-entropy summed over real target tokens, written out.

loss_sum, n_tokens = token_loss(logits, batch.tgt_out, label_smoothing=0.1)   # logits (B, T, V)
(loss_sum / n_tokens).backward()

Training skips the padded target positions before the output layer (the largest matmuls of a step and the
loss's passes over V): rows = loss_rows(batch.tgt_out) lists the positions to score, and

    logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in, rows)        # (N, V)
    loss_sum, n_tokens = token_loss(logits, batch.tgt_out.reshape(-1)[rows], 0.1)

gives the same loss. N is the real tokens rounded up to a multiple of LOSS_ROW_MULTIPLE with padded
positions (which the loss ignores), so that batches share a few row counts: on a CPU with bf16 hardware
every new matmul shape costs a kernel compilation (nmt/memory.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.shapes import ROW_MULTIPLE, padded_count
from nmt.special import PAD_ID

LOSS_ROW_MULTIPLE = ROW_MULTIPLE  # loss_rows: row counts rounded up to this (a few shapes rather than one per batch)
LOSS_CHUNK_ROWS = 16  # target tokens per piece: an fp32 piece of the logits (512 KiB at 8k pieces) stays in cache


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of logits (N, V) against target (N,), skipping PAD targets.

    loss_n = (1 - eps) * (lse_n - x_n[y_n]) + eps * (lse_n - mean_v x_n[v]), lse_n = logsumexp_v x_n[v],
    the same value as F.cross_entropy(..., label_smoothing=eps, reduction="sum"). Written out because its
    gradient is one expression, softmax(x) - (1 - eps) onehot(y) - eps / V, computed in place, where
    autograd's log_softmax/nll path takes about twice as many passes over the logits. Both directions work
    through the logits LOSS_CHUNK_ROWS rows at a time: each piece is converted to fp32 in a small buffer
    that stays in cache, so no fp32 copy of the (N, V) logits (tens of megabytes, written to fresh pages)
    is ever made. Everything is computed in fp32, whatever the dtype of the logits.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float) -> Tensor:
        real = target != PAD_ID  # (N,)
        N, V = logits.shape
        lse, picked = logits.new_empty(N, dtype=torch.float32), logits.new_empty(N, dtype=torch.float32)
        mean = logits.new_empty(N, dtype=torch.float32) if eps else None
        for r0 in range(0, N, LOSS_CHUNK_ROWS):
            r1 = min(N, r0 + LOSS_CHUNK_ROWS)
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
        for r0 in range(0, N, LOSS_CHUNK_ROWS):
            r1 = min(N, r0 + LOSS_CHUNK_ROWS)
            g = torch.sub(logits[r0:r1], lse[r0:r1, None]).exp_()  # (rows, V) fp32: the softmax
            if eps:
                g.sub_(eps / V)
            g.scatter_add_(1, target[r0:r1, None], g.new_full((r1 - r0, 1), -(1 - eps)))
            out[r0:r1] = g.mul_(scale[r0:r1, None])
        return out, None, None


def token_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> tuple[Tensor, int]:
    """Summed cross-entropy over real target tokens (padding ignored) and their count.

    Divide the sum by the count (over a whole accumulated batch) for the per-token loss.
    Computed in fp32 whatever the autocast dtype.
    """
    V = logits.size(-1)
    logits, target = logits.reshape(-1, V), target.reshape(-1)
    n_real = int((target != PAD_ID).sum())
    return _SmoothedCrossEntropy.apply(logits, target, float(label_smoothing)), n_real


def loss_rows(target: Tensor, multiple: int = LOSS_ROW_MULTIPLE) -> Tensor:
    """Flat indices (N,) into `target` (B, T), ascending: every real token, then padded positions (the first
    ones) until N is a multiple of `multiple`, or all B x T positions if there are not that many."""
    flat = target.reshape(-1)
    padding = (flat == PAD_ID).to(torch.int8)
    n_real = flat.numel() - int(padding.sum())
    n = min(flat.numel(), padded_count(n_real, multiple))
    return torch.argsort(padding, stable=True)[:n].sort().values
