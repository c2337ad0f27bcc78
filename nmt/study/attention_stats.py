"""How sharp a model's attention is: teacher-forced statistics over a set of pairs (a study's test captions).

    stats = attention_statistics(translator.model, translator.tokenizer, pairs)
    # {"sentences", "tokens", "entropy", "uniform_entropy", "max_weight", "score_spread"}

With the references fed to the decoder (teacher forcing), every target token's attention over its source: its
entropy in nats (0: all weight on one position; log S: uniform), the entropy of a uniform distribution over the
same source for comparison, and its largest weight; averaged over target tokens. `score_spread` is the mean over
target tokens of the largest score minus the mean score over the real source positions (read from the log-weights,
which differ from the scores by a constant per token; weights below 1e-30 count as 1e-30, so a spread is at most
about 69): how saturated the softmax is (a spread of 10 puts e^10 ~ 22,000 times the weight on the top position as
on an average one). A study records them for every run, so a model whose seeds differ can be compared by how its
attention settled, not only by its BLEU. Models without an alignment (attention=none) have none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nmt.special import BOS_ID, PAD_ID


def _padded(seqs: list[list[int]]) -> torch.Tensor:
    """(B, L) long, PAD_ID after each sequence."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


@torch.no_grad()
def attention_statistics(model, tokenizer, pairs: Sequence[tuple[str, str]], batch_size: int = 64) -> dict | None:
    """Teacher-forced attention statistics of `model` over `pairs` (source, reference); None without an
    alignment (attention=none) or without pairs."""
    if not model.attention.has_alignment or not pairs:
        return None
    model.eval()
    device = next(model.parameters()).device
    totals = {"entropy": 0.0, "uniform_entropy": 0.0, "max_weight": 0.0, "score_spread": 0.0}
    tokens = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        src_ids = tokenizer.encode_src([s for s, _ in chunk])
        tgt_ids = tokenizer.encode_tgt([t for _, t in chunk])
        src, tgt_out = _padded(src_ids), _padded(tgt_ids)  # (B, S), (B, T)
        tgt_in = torch.cat([torch.full_like(tgt_out[:, :1], BOS_ID), tgt_out[:, :-1]], dim=1)  # (B, T)
        tgt_lengths = torch.tensor([len(t) for t in tgt_ids])  # (B,)
        tgt_in.masked_fill_(torch.arange(tgt_in.size(1)) >= tgt_lengths[:, None], PAD_ID)
        src_lengths = torch.tensor([len(s) for s in src_ids])  # (B,)
        _, weights = model(src.to(device), src_lengths, tgt_in.to(device), tgt_lengths=tgt_lengths, logits=False)
        weights = weights.float().cpu()  # (B, T, S)
        real = torch.arange(weights.size(1)) < tgt_lengths[:, None]  # (B, T) real target positions
        w = weights[real]  # (N, S): every real target token's weights (zero on padding)
        entropy = -(w * torch.log(w.clamp_min(1e-30))).sum(-1)  # (N,)
        uniform = torch.log(src_lengths.float())[:, None].expand_as(real)[real]  # (N,)
        totals["entropy"] += float(entropy.sum())
        totals["uniform_entropy"] += float(uniform.sum())
        totals["max_weight"] += float(w.max(-1).values.sum())
        # the softmax's input: log-weights differ from the scores by a per-row constant, so the largest minus the
        # mean over the real source positions is the scores' own spread
        logw = torch.log(w.clamp_min(1e-30))  # (N, S)
        src_real = (torch.arange(weights.size(2)) < src_lengths[:, None])[:, None, :].expand_as(weights)[real]
        mean_log = (logw * src_real).sum(-1) / src_real.sum(-1)  # (N,)
        totals["score_spread"] += float((logw.max(-1).values - mean_log).sum())
        tokens += int(real.sum())
    out = {k: v / tokens for k, v in totals.items()}
    if not all(math.isfinite(v) for v in out.values()):
        return None
    return {"sentences": len(pairs), "tokens": tokens, **out}
