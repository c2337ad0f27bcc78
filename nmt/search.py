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

from nmt.kernels.top_logprobs import top_log_probs
from nmt.model import Seq2Seq
from nmt.special import BOS_ID, EOS_ID, PAD_ID

LSE_ROWS = 64  # rows of logits converted to fp32 at a time for the log-normaliser: a few hundred KiB
DONE_SHARE = 0.25  # done sentences leave the batch (greedy and beam search) once they are this share of it


def _normaliser(logits: Tensor) -> Tensor:
    """log sum_v exp(logits) per row, in fp32, from logits in any dtype: (N, V) -> (N,).

    Rows are converted a few at a time, so the fp32 copy of the logits (tens of megabytes in beam search)
    is never built."""
    out = logits.new_empty(logits.size(0), dtype=torch.float32)
    for r0 in range(0, logits.size(0), LSE_ROWS):
        torch.logsumexp(logits[r0 : r0 + LSE_ROWS].float(), dim=-1, out=out[r0 : r0 + LSE_ROWS])
    return out


def _top_log_probs(model: Seq2Seq, h: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k most likely outputs of every row and their fp32 log-probabilities, from the output layer's input h~:
    (N, H) -> (N, k), (N, k), largest first.

    One C++ call after the layer's matmul where the compiled kernels run (nmt.kernels.top_logprobs), else torch
    operations on the layer's logits: padding and BOS are never outputs, so they are set to -inf in the logits
    (fresh, the caller's) after the normaliser, which is that of the full softmax, is taken."""
    layer = model.decoder.output
    found = top_log_probs(h, layer.weight, layer.bias, k, (PAD_ID, BOS_ID))
    if found is not None:
        return found
    logits = layer(h)  # (N, V)
    lse = _normaliser(logits)  # (N,)
    logits[:, PAD_ID] = float("-inf")
    logits[:, BOS_ID] = float("-inf")
    values, ids = logits.topk(k, dim=-1)  # (N, k): ranked on the logits, monotone in the log-probabilities
    return values.float() - lse[:, None], ids


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
def greedy(
    model: Seq2Seq,
    src: Tensor,
    lengths: Tensor,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
    alpha: float = 0.0,
) -> list[list[Hypothesis]]:
    """Pick the most likely word at every step, for all sentences at once.

    A sentence is done at EOS or at its length limit; done sentences leave the batch once they are DONE_SHARE of
    it (as in beam search), so the steps get cheaper as sentences finish: decoding test2016 greedily in fp32
    computed about 1.8 times the output rows it needed when every sentence stayed to the end of its batch."""
    B, dev = src.size(0), src.device
    enc, keys, values, state = model.encode(src, lengths)
    mask = enc.mask
    params = model.decoder.step_params(dev)
    limits = max_lengths(lengths, max_len_ratio, max_len_extra)
    limit_t = torch.tensor(limits, device=dev)  # (A,)
    sentence = torch.arange(B, device=dev)  # (A,) original index of each active sentence
    done = torch.zeros(B, dtype=torch.bool, device=dev)  # (A,)
    prev = src.new_full((B,), BOS_ID)  # (A,)
    steps: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # per step: sentence (A,), token, log-prob, weights (A, S)
    for t in range(max(limits)):
        h, state, w = model.decoder.step(prev, state, keys, values, mask, params, logits=False)
        best_logp, prev = (x[:, 0] for x in _top_log_probs(model, h, 1))  # (A,)
        steps.append((sentence, prev, best_logp, w.float()))
        done |= (prev == EOS_ID) | (limit_t <= t + 1)
        if bool(done.all()):
            break
        if int(done.sum()) >= DONE_SHARE * sentence.size(0):  # the done sentences leave: their rows go
            kept = (~done).nonzero().squeeze(1)  # (A',)
            sentence, limit_t, done, prev = (x.index_select(0, kept) for x in (sentence, limit_t, done, prev))
            keys, values, mask = (x.index_select(0, kept) for x in (keys, values, mask))
            state = state.select(kept)
    T, S = len(steps), src.size(1)
    toks = torch.full((B, T), PAD_ID, dtype=torch.long, device=dev)
    lps = torch.zeros(B, T, device=dev)
    att = torch.zeros(B, T, S, device=dev)
    for t, (rows, token, logp, w) in enumerate(steps):  # back to (B, steps): rows after a sentence left stay unread
        toks[rows, t], lps[rows, t], att[rows, t] = token, logp.float(), w
    toks, lps, att = toks.tolist(), lps.cpu(), att.cpu()
    out = []
    for b in range(B):
        seq = toks[b][: limits[b]]
        n = seq.index(EOS_ID) + 1 if EOS_ID in seq else len(seq)  # steps taken, EOS included
        body = seq[:n] if seq[n - 1 : n] != [EOS_ID] else seq[: n - 1]
        score = float(lps[b, :n].sum()) / length_penalty(n, alpha)
        out.append([Hypothesis(body, score, att[b, :n, : int(lengths[b])])])
    return out


class _AttentionTrace:
    """Every step's attention rows and back-pointers, so a hypothesis's attention history is rebuilt
    only for the hypotheses returned, instead of being copied along with every beam at every step."""

    def __init__(self):
        self.weights: list[Tensor] = []  # step t: (B*K, S) the attention of each beam alive at step t
        self.parents: list[Tensor] = []  # step t: (B*K,) the beam at step t that beam k at step t + 1 extends

    def rebuild(self, ends: list[tuple[int, int]]) -> Tensor:
        """(step t, beam at step t) per hypothesis -> (H, max t + 1, S): row s is its attention at step s."""
        steps = torch.tensor([t for t, _ in ends])
        beam = torch.tensor([k for _, k in ends], device=self.weights[0].device)
        rows = []
        for s in range(int(steps.max()), -1, -1):
            live = (steps >= s).to(beam.device)  # hypotheses that had reached step s
            at_s = torch.where(live, beam, 0)  # (H,) row 0 stands in for the others: cut off later
            rows.append(self.weights[s].index_select(0, at_s))  # (H, S)
            if s:
                beam = torch.where(live, self.parents[s - 1].index_select(0, at_s), beam)
        return torch.stack(rows[::-1], dim=1).float().cpu()


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    lengths: Tensor,
    beam_size: int = 5,
    nbest: int = 1,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
    alpha: float = 1.0,
) -> list[list[Hypothesis]]:
    """Keep the `beam_size` best prefixes of every sentence; return the `nbest` best finished ones.

    The decoder state, the input-feed vector and the tokens of each beam are reordered together at
    every step; attention is kept per step with back-pointers. A sentence is done when the best candidate
    of a step is EOS and it has `nbest` finished hypotheses (OpenNMT-py's and JoeyNMT's rule: the search
    stops once its best-scoring prefix has ended, rather than waiting for `beam_size` hypotheses to end,
    which decoded test2016 with 11% fewer decoder rows), when it has `beam_size` finished hypotheses, or
    at its maximum length (its live beams are then finished as they are). A longer search can only add
    finished hypotheses, so asking for more (`nbest`) never returns a worse best one. Step 0 runs once per
    sentence, since all its beams extend BOS from one state. Done sentences leave the batch, a quarter of
    it at a time, so the steps get cheaper as sentences finish; until they leave, the output layer skips
    their rows. Candidates are ranked on the logits of each beam's 2K best continuations (the 2K best of a
    sentence are among them), so no (beams x vocabulary) table of scores is built.
    """
    B, K, dev = src.size(0), beam_size, src.device
    if nbest > K:
        raise ValueError(f"nbest ({nbest}) cannot exceed the beam size ({K})")
    enc, keys, values, state = model.encode(src, lengths)
    params = model.decoder.step_params(dev)
    C = min(2 * K, model.decoder.output.out_features)  # continuations considered per beam
    beam_index = torch.arange(B, device=dev).repeat_interleave(K)  # (B*K,) sentence of each beam
    # step 0 runs once per sentence (its K beams would extend BOS from one state), then the beams are made
    h, state, w = model.decoder.step(src.new_full((B,), BOS_ID), state, keys, values, enc.mask, params, logits=False)
    first = tuple(x.index_select(0, beam_index) for x in _top_log_probs(model, h, C))  # (B*K, C) each
    keys, values = keys.index_select(0, beam_index), values.index_select(0, beam_index)
    mask, state, w = enc.mask.index_select(0, beam_index), state.select(beam_index), w.index_select(0, beam_index)
    del h
    limits = max_lengths(lengths, max_len_ratio, max_len_extra)

    # the sentences still searching; a finished sentence leaves the batch (beam rows are renumbered then)
    sentence = torch.arange(B, device=dev)  # (A,) original index of each active sentence
    limit_t = torch.tensor(limits, device=dev)  # (A,)
    n_finished = torch.zeros(B, dtype=torch.long, device=dev)  # (A,)
    scores = torch.full((B, K), float("-inf"), device=dev)  # (A, K)
    scores[:, 0] = 0.0  # all beams start identical: keep only one alive at first
    prev = src.new_full((B * K,), BOS_ID)  # (A*K,) the last token of each beam (step 0 has run already)
    history = src.new_zeros(B * K, 0)  # (A*K, t) tokens so far
    trace = _AttentionTrace()
    finished: list[list[tuple[float, list[int], int, int]]] = [[] for _ in range(B)]  # (score, tokens, t, beam)
    in_top = torch.arange(2 * K, device=dev) < K
    top_finished = torch.zeros(B, dtype=torch.bool, device=dev)  # (A,) the best candidate of a step was EOS
    live: Tensor | None = None  # the beams of sentences still searching, (A'*K,), where some are done; else None

    for t in range(max(limits)):
        A = sentence.size(0)
        if t:  # the logits of live beams only: a done sentence waiting to leave the batch can extend nothing
            h, state, w = model.decoder.step(prev, state, keys, values, mask, params, live, logits=False)
            # the 2K best candidates of a sentence are among the 2K best continuations of each of its beams
            beam_logp, beam_ids = _top_log_probs(model, h, C)  # (live rows, C)
            if live is not None:  # the done sentences' rows: any finite numbers (their scores are -inf)
                beam_logp = beam_logp.new_zeros(A * K, C).index_copy_(0, live, beam_logp)  # (A*K, C)
                beam_ids = beam_ids.new_full((A * K, C), PAD_ID).index_copy_(0, live, beam_ids)
        else:
            beam_logp, beam_ids = first  # (B*K, C): each sentence's row of step 0, once per beam
        trace.weights.append(w)
        cand = (scores[:, :, None] + beam_logp.view(A, K, C)).view(A, K * C)  # (A, K*C)
        top_scores, top_pos = cand.topk(2 * K, dim=1)  # (A, 2K): enough to keep K alive besides EOS
        origin, token = top_pos // C, beam_ids.view(A, K * C).gather(1, top_pos)  # (A, 2K)
        rows = (torch.arange(A, device=dev)[:, None] * K + origin).view(-1)  # (A*2K,) beam each candidate extends
        tok_now = torch.cat([history.index_select(0, rows), token.view(-1, 1)], dim=1)  # (A*2K, t+1)
        is_eos = token == EOS_ID
        at_limit = limit_t <= t + 1  # (A,)

        # finished hypotheses: EOS among a sentence's top K candidates, or its top K at the length limit
        ends = (is_eos | at_limit[:, None]) & in_top & torch.isfinite(top_scores)  # (A, 2K)
        where = ends.nonzero()
        if len(where):
            flat = where[:, 0] * 2 * K + where[:, 1]
            penalty = length_penalty(t + 1, alpha)
            for b, body, score, beam in zip(
                sentence.index_select(0, where[:, 0]).tolist(),
                tok_now.index_select(0, flat).tolist(),
                top_scores[ends].tolist(),
                rows.index_select(0, flat).tolist(),
                strict=True,
            ):
                if body[-1] == EOS_ID:
                    body = body[:-1]
                finished[b].append((score / penalty, body, t, beam))
            n_finished += ends.sum(dim=1)
        top_finished |= is_eos[:, 0]
        active = (n_finished < K) & ~(top_finished & (n_finished >= nbest)) & ~at_limit  # (A,)
        if not bool(active.any()):
            break

        # live beams: the K best candidates that did not end. A done sentence stays in the batch with
        # scores of -inf (it can end nothing more) until a quarter of the batch is done; then all done
        # sentences leave at once, so the keys and values are not copied at every step.
        live_scores = top_scores.masked_fill(is_eos, float("-inf"))
        keep_scores, keep = live_scores.topk(K, dim=1)  # (A, K) positions within the 2K
        keep_scores = keep_scores.masked_fill(~active[:, None], float("-inf"))
        compact = int((~active).sum()) >= DONE_SHARE * A
        kept = active.nonzero().squeeze(1) if compact else torch.arange(A, device=dev)  # (A',)
        chosen = (kept[:, None] * 2 * K + keep.index_select(0, kept)).view(-1)  # (A'*K,)
        beam_rows = rows.index_select(0, chosen)  # the beam (numbered at step t) each survivor extends
        trace.parents.append(beam_rows)
        if compact:  # the done sentences leave: their rows go
            sentence, limit_t, n_finished = (x.index_select(0, kept) for x in (sentence, limit_t, n_finished))
            top_finished = top_finished.index_select(0, kept)
            keys, values, mask = (x.index_select(0, beam_rows) for x in (keys, values, mask))
        scores = keep_scores.index_select(0, kept)
        live = None if compact or bool(active.all()) else active.repeat_interleave(K).nonzero().squeeze(1)
        history = tok_now.index_select(0, chosen)
        state = state.select(beam_rows)
        prev = token.view(-1).index_select(0, chosen)

    best = [sorted(f, key=lambda h: -h[0])[:nbest] for f in finished]
    ends_at = [(t, beam) for hyps in best for _, _, t, beam in hyps]
    attention = trace.rebuild(ends_at) if ends_at else None
    out, i = [], 0
    for b, hyps in enumerate(best):
        n = int(lengths[b])
        out.append(
            [Hypothesis(body, score, attention[i + j, : t + 1, :n]) for j, (score, body, t, _) in enumerate(hyps)]
        )
        i += len(hyps)
    return out


def search(
    model: Seq2Seq,
    src: Tensor,
    lengths: Tensor,
    beam_size: int = 1,
    nbest: int = 1,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
    alpha: float = 1.0,
) -> list[list[Hypothesis]]:
    """Greedy for beam_size 1 and nbest 1, beam search otherwise."""
    if beam_size == 1 and nbest == 1:
        return greedy(model, src, lengths, max_len_ratio, max_len_extra, alpha)
    return beam_search(model, src, lengths, beam_size, nbest, max_len_ratio, max_len_extra, alpha)
