"""The training loss: label-smoothed cross-entropy summed over real target tokens, written out.

loss_sum, n_tokens = token_loss(logits, batch.tgt_out, label_smoothing=0.1)   # logits (B, T, V)
(loss_sum / n_tokens).backward()
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.tokenizer import PAD_ID

LOSS_CHUNK_ROWS = 2048  # target tokens per piece when the loss is computed without gradients


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of logits (N, V) against target (N,), skipping PAD targets.

    loss_n = (1 - eps) * (lse_n - x_n[y_n]) + eps * (lse_n - mean_v x_n[v]), lse_n = logsumexp_v x_n[v],
    the same value as F.cross_entropy(..., label_smoothing=eps, reduction="sum"). Written out because its
    gradient is one expression, softmax(x) - (1 - eps) onehot(y) - eps / V, computed in place in two passes
    over the (N, V) logits, where autograd's log_softmax/nll path takes about twice as many (a third of the
    loss's time in a bf16 training step on a CPU). Everything is fp32, whatever the dtype of the logits.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float) -> Tensor:
        real = target != PAD_ID  # (N,)
        x = logits.float()
        lse = torch.logsumexp(x, dim=-1)  # (N,)
        picked = x.gather(1, target[:, None]).squeeze(1)  # (N,)
        loss = (1 - eps) * (lse - picked)
        if eps:
            loss = loss + eps * (lse - x.mean(dim=-1))
        ctx.save_for_backward(logits, target, lse, real)
        ctx.eps = eps
        return loss.masked_fill(~real, 0.0).sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, target, lse, real = ctx.saved_tensors
        eps, V = ctx.eps, logits.size(-1)
        g = logits.to(torch.float32, copy=True)  # a new tensor even for fp32 logits: it is changed in place
        g.sub_(lse[:, None]).exp_()  # softmax
        if eps:
            g.sub_(eps / V)
        g.scatter_add_(1, target[:, None], g.new_full((len(target), 1), -(1 - eps)))
        g.mul_((grad * real)[:, None])
        return g.to(logits.dtype), None, None


def token_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> tuple[Tensor, int]:
    """Summed cross-entropy over real target tokens (padding ignored) and their count.

    Divide the sum by the count (over a whole accumulated batch) for the per-token loss.
    Computed in fp32 whatever the autocast dtype.
    """
    V = logits.size(-1)
    logits, target = logits.reshape(-1, V), target.reshape(-1)
    n_real = int((target != PAD_ID).sum())
    if torch.is_grad_enabled():
        return _SmoothedCrossEntropy.apply(logits, target, float(label_smoothing)), n_real
    # no gradient (validation): a few thousand rows at a time, so the fp32 temporaries stay small
    chunks = zip(logits.split(LOSS_CHUNK_ROWS), target.split(LOSS_CHUNK_ROWS), strict=True)
    return sum(_SmoothedCrossEntropy.apply(x, y, float(label_smoothing)) for x, y in chunks), n_real
