"""Greedy and batched beam search over the decoder's single step.

    hyps = search(model, batch.src, batch.src_lengths, beam_size=5, nbest=1)
    hyps[b][0].tokens, hyps[b][0].score, hyps[b][0].attention   # best of sentence b

Every hypothesis carries its tokens (EOS excluded), its score (log-probability divided by the length
penalty) and its attention weights (one row per output token, EOS included, over the real source tokens).
The maximum output length of a sentence is `max_len_ratio * source length + max_len_extra`.
Shapes: B sentences, K beams, S source length, V target vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.model import Seq2Seq
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID


def _log_probs(logits: Tensor) -> Tensor:
    """fp32 log-probabilities with padding and BOS ruled out (they are never outputs)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp[:, PAD_ID] = float("-inf")
    logp[:, BOS_ID] = float("-inf")
    return logp


@dataclass
class Hypothesis:
    tokens: list[int]
    score: float
    attention: Tensor  # (steps, S_real) float32 CPU: len(tokens) + 1 rows with EOS, len(tokens) if cut at the limit


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ((5 + length) / 6) ** alpha; alpha = 0 ranks by raw log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src_lengths: Tensor, ratio: float, extra: int) -> list[int]:
    return [int(ratio * int(n) + extra) for n in src_lengths]


@torch.no_grad()
def greedy(model: Seq2Seq, src: Tensor, lengths: Tensor, max_len_ratio: float = 1.5, max_len_extra: int = 10,
           alpha: float = 0.0) -> list[list[Hypothesis]]:
    """Pick the most likely word at every step, for all sentences at once."""
    B = src.size(0)
    enc, keys, values, state = model.encode(src, lengths)
    limits = max_lengths(lengths, max_len_ratio, max_len_extra)
    prev = src.new_full((B,), BOS_ID)
    tokens, logps, weights = [], [], []
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    for _ in range(max(limits)):
        logits, state, w = model.decoder.step(prev, state, keys, values, enc.mask)
        logp = _log_probs(logits)  # (B, V)
        best_logp, prev = logp.max(dim=-1)  # (B,)
        tokens.append(prev)
        logps.append(best_logp)
        weights.append(w.float())
        finished |= prev == EOS_ID
        if bool(finished.all()):
            break
    toks = torch.stack(tokens, 1).tolist()  # (B, steps)
    lps = torch.stack(logps, 1).cpu()
    att = torch.stack(weights, 1).cpu()  # (B, steps, S)
    out = []
    for b in range(B):
        seq = toks[b][: limits[b]]
        n = seq.index(EOS_ID) + 1 if EOS_ID in seq else len(seq)  # steps taken, EOS included
        body = seq[:n] if seq[n - 1 : n] != [EOS_ID] else seq[: n - 1]
        score = float(lps[b, :n].sum()) / length_penalty(n, alpha)
        out.append([Hypothesis(body, score, att[b, :n, : int(lengths[b])])])
    return out


@torch.no_grad()
def beam_search(model: Seq2Seq, src: Tensor, lengths: Tensor, beam_size: int = 5, nbest: int = 1,
                max_len_ratio: float = 1.5, max_len_extra: int = 10, alpha: float = 1.0) -> list[list[Hypothesis]]:
    """Keep the `beam_size` best prefixes of every sentence; return the `nbest` best finished ones.

    The decoder state, the input-feed vector, the tokens and the attention history of each beam are
    reordered together at every step. A sentence is done when it has `beam_size` finished hypotheses
    or reaches its maximum length (its live beams are then finished as they are).
    """
    B, K = src.size(0), beam_size
    if nbest > K:
        raise ValueError(f"nbest ({nbest}) cannot exceed the beam size ({K})")
    enc, keys, values, state = model.encode(src, lengths)
    beam_index = torch.arange(B, device=src.device).repeat_interleave(K)  # (B*K,) sentence of each beam
    keys, values = keys.index_select(0, beam_index), values.index_select(0, beam_index)
    mask, state = enc.mask.index_select(0, beam_index), state.select(beam_index)
    limits = max_lengths(lengths, max_len_ratio, max_len_extra)

    scores = torch.full((B, K), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all beams start identical: keep only one alive at first
    prev = src.new_full((B * K,), BOS_ID)
    history = src.new_zeros(B * K, 0)  # (B*K, t) tokens so far
    att_history = torch.zeros(B * K, 0, src.size(1))  # (B*K, t, S) on the CPU
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    offsets = (torch.arange(B, device=src.device) * K)[:, None]  # (B, 1)

    for t in range(max(limits)):
        logits, state, w = model.decoder.step(prev, state, keys, values, mask)
        V = logits.size(-1)
        logp = _log_probs(logits).view(B, K, V)
        cand = (scores[:, :, None] + logp).view(B, K * V)  # (B, K*V)
        top_scores, top_ids = cand.topk(2 * K, dim=1)  # (B, 2K): enough to keep K alive besides EOS
        origin, token = top_ids // V, top_ids % V  # (B, 2K)
        rows = (offsets + origin).view(-1)  # (B*2K,) beam each candidate extends
        att_now = att_history.index_select(0, rows.cpu())
        att_now = torch.cat([att_now, w.float().cpu().index_select(0, rows.cpu())[:, None, :]], dim=1)
        tok_now = torch.cat([history.index_select(0, rows), token.view(-1, 1)], dim=1)  # (B*2K, t+1)
        is_eos = token == EOS_ID
        at_limit = torch.tensor([t + 1 >= limits[b] for b in range(B)], device=src.device)
        done_now = torch.tensor(done, device=src.device)

        # finished hypotheses: EOS among a sentence's top K candidates, or its top K at the length limit
        in_top = torch.arange(2 * K, device=src.device) < K
        ends = (is_eos | at_limit[:, None]) & in_top & torch.isfinite(top_scores) & ~done_now[:, None]
        for b, j in ends.nonzero().tolist():
            r = b * 2 * K + j
            body = tok_now[r].tolist()
            if body[-1] == EOS_ID:
                body = body[:-1]
            score = float(top_scores[b, j]) / length_penalty(t + 1, alpha)
            finished[b].append(Hypothesis(body, score, att_now[r, :, : int(lengths[b])]))
        for b in range(B):
            if len(finished[b]) >= K or bool(at_limit[b]):
                done[b] = True
        if all(done):
            break

        # live beams: the K best candidates that did not end
        live_scores = top_scores.masked_fill(is_eos, float("-inf"))
        keep_scores, keep = live_scores.topk(K, dim=1)  # (B, K) positions within the 2K
        keep_scores[torch.tensor(done, device=src.device)] = float("-inf")
        chosen = (torch.arange(B, device=src.device)[:, None] * 2 * K + keep).view(-1)  # (B*K,)
        scores = keep_scores
        history = tok_now.index_select(0, chosen)
        att_history = att_now.index_select(0, chosen.cpu())
        beam_rows = rows.index_select(0, chosen)  # the beam each survivor extends
        state = state.select(beam_rows)
        prev = token.view(-1).index_select(0, chosen)

    return [sorted(f, key=lambda h: -h.score)[:nbest] for f in finished]


def search(model: Seq2Seq, src: Tensor, lengths: Tensor, beam_size: int = 1, nbest: int = 1,
           max_len_ratio: float = 1.5, max_len_extra: int = 10, alpha: float = 1.0) -> list[list[Hypothesis]]:
    """Greedy for beam_size 1 and nbest 1, beam search otherwise."""
    if beam_size == 1 and nbest == 1:
        return greedy(model, src, lengths, max_len_ratio, max_len_extra, alpha)
    return beam_search(model, src, lengths, beam_size, nbest, max_len_ratio, max_len_extra, alpha)
