"""Validation during training: teacher-forced loss and greedy BLEU/chrF on an encoded split.

    metrics = evaluate_split(model, data, "valid", device, batch_tokens=4000, edges=[0, 10, 20, 30])

The trainer calls it at every validation; nmt.evaluation scores a translator on raw text instead (nmt-evaluate,
nmt-study). Sentences are batched by source length, the loss is computed without label smoothing, and up to
`heatmaps` fixed sentences spread over lengths come back as attention figures for TensorBoard (and, with
model.self_attention_layers > 0, as figures of the encoder's self-attention: a map per layer and head).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from nmt.data import EncodedSplit, PreparedData, collate
from nmt.evaluation import heatmap_picks
from nmt.loss import token_loss
from nmt.metrics import bleu_by_length, corpus_scores
from nmt.model import Seq2Seq
from nmt.search import greedy

HEATMAP_MAX_PIECES = 40


def spread(n: int, count: int | None) -> list[int]:
    """`count` indices spread evenly over range(n) (all of them when count is None or >= n), so a capped
    validation samples the whole split (on the Bible: every book, not Genesis alone)."""
    if count is None or count >= n:
        return list(range(n))
    return [i * n // count for i in range(count)]


@torch.no_grad()
def evaluate_split(
    model: Seq2Seq,
    data: PreparedData,
    split: str,
    device: torch.device,
    batch_tokens: int,
    edges: list[int],
    max_sentences: int | None = None,
    autocast=nullcontext,
    heatmaps: int = 0,
) -> dict:
    """Teacher-forced loss/perplexity plus greedy BLEU/chrF (overall and by source length) on `split`."""
    model.eval()
    encoded: EncodedSplit = data.encoded[split]
    pairs = data.pairs(split)
    chosen = spread(len(encoded), max_sentences)  # indices into the split, in corpus order
    order = sorted(range(len(chosen)), key=lambda i: int(encoded.src_lengths[chosen[i]]))
    hyps: list[str] = [""] * len(chosen)
    attention: dict[int, torch.Tensor] = {}
    # fixed sentences spread over source lengths, the longest of at most 40 pieces included (a readable figure)
    readable = [x if x <= HEATMAP_MAX_PIECES else 0 for x in encoded.src_lengths[chosen].tolist()]
    picks = heatmap_picks(readable, heatmaps)
    nll, tokens, i = 0.0, 0, 0
    while i < len(order):
        width = int(max(encoded.src_lengths[chosen[order[i]]], 1))
        j = i + max(1, batch_tokens // (2 * width))
        idx = order[i:j]
        batch = collate(encoded, [chosen[c] for c in idx]).to(device)
        with autocast():
            logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
            loss, k = token_loss(logits, batch.tgt_out, 0.0)
            del logits  # (B, T, V): the largest tensor of validation; not needed while decoding
            results = greedy(model, batch.src, batch.src_lengths)
        nll, tokens = nll + float(loss), tokens + k
        for b, sent in enumerate(idx):
            hyps[sent] = data.tokenizer.decode_tgt(results[b][0].tokens)
            if sent in picks:
                attention[sent] = results[b][0]
        i = j
    pairs = [pairs[k] for k in chosen]
    refs = [t for _, t in pairs]
    scores = corpus_scores(hyps, refs, ter=False)
    figures, self_figures = [], []
    if picks:  # matplotlib takes a quarter of a second to import: only where a heatmap is drawn
        from nmt.plotting import attention_figure, self_attention_figure
    for sent in picks:
        hyp = attention[sent]
        src_text = pairs[sent][0]
        labels = data.tokenizer.tgt_pieces(hyp.tokens)
        labels += ["</s>"] if hyp.attention.size(0) > len(hyp.tokens) else []  # no EOS when cut at the limit
        figures.append(
            attention_figure(
                hyp.attention,
                data.tokenizer.src_pieces(src_text),
                labels,
                title=src_text[:80],
                has_alignment=model.attention.has_alignment,
            )
        )
        if model.has_self_attention:
            one = collate(encoded, [chosen[sent]]).to(device)
            with autocast():
                layers = model.self_attention_weights(one.src, one.src_lengths)  # [(1, N, S, S)]
            weights = torch.stack([w[0] for w in layers])  # (layers, N, S, S)
            self_figures.append(self_attention_figure(weights, data.tokenizer.src_pieces(src_text), src_text[:80]))
    loss = nll / max(tokens, 1)
    return {
        "loss": round(loss, 5),
        "ppl": round(math.exp(min(loss, 50)), 3),
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "by_length": bleu_by_length([s for s, _ in pairs], hyps, refs, edges),
        "hypotheses": hyps,
        "figures": figures,
        "self_figures": self_figures,
    }
