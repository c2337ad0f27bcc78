"""Translation quality with sacrebleu on detokenized text: BLEU, chrF and TER with their signatures,
BLEU by source length (in whitespace words), and bootstrap confidence intervals.

    scores = corpus_scores(hypotheses, references)      # {"bleu": 31.2, "chrf": 55.0, "ter": ..., "signatures": ...}
    rows = bleu_by_length(sources, hypotheses, references, edges=(0, 10, 20, 30, 40, 50))
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF, TER

DEFAULT_EDGES = (0, 10, 20, 30, 40, 50)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], ter: bool = True) -> dict:
    """Corpus BLEU, chrF (and TER) with sacrebleu's default settings and signatures."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    out = {
        "bleu": round(bleu.corpus_score(list(hypotheses), [list(references)]).score, 2),
        "chrf": round(chrf.corpus_score(list(hypotheses), [list(references)]).score, 2),
        "signatures": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())},
    }
    if ter:
        metric = TER()
        out["ter"] = round(metric.corpus_score(list(hypotheses), [list(references)]).score, 2)
        out["signatures"]["ter"] = str(metric.get_signature())
    return out


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """Labels for buckets [e_0, e_1), [e_1, e_2), ..., [e_last, inf): "0-9", "10-19", ..., "50+"."""
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    return labels + [f"{edges[-1]}+"]


def bucket_of(n_words: int, edges: Sequence[int]) -> int:
    """Index of the bucket holding a sentence of `n_words` words (lower edge inclusive)."""
    if not edges or list(edges) != sorted(set(edges)) or edges[0] != 0:
        raise ValueError(f"bucket edges must start at 0 and increase strictly, got {list(edges)}")
    index = 0
    for i, edge in enumerate(edges):
        if n_words >= edge:
            index = i
    return index


def bleu_by_length(
    sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str], edges: Sequence[int] = DEFAULT_EDGES
) -> list[dict]:
    """One row per source-length bucket: {"bucket", "lo", "hi", "n", "bleu", "chrf"} (empty buckets: n = 0)."""
    labels = bucket_labels(edges)
    members: list[list[int]] = [[] for _ in labels]
    for i, src in enumerate(sources):
        members[bucket_of(len(src.split()), edges)].append(i)
    rows = []
    for k, idx in enumerate(members):
        row = {"bucket": labels[k], "lo": edges[k], "hi": edges[k + 1] if k + 1 < len(edges) else None, "n": len(idx)}
        if idx:
            s = corpus_scores([hypotheses[i] for i in idx], [references[i] for i in idx], ter=False)
            row.update(bleu=s["bleu"], chrf=s["chrf"])
        else:
            row.update(bleu=None, chrf=None)
        rows.append(row)
    return rows


def bootstrap_bleu(
    hypotheses: Sequence[str], references: Sequence[str], samples: int = 1000, seed: int = 12345
) -> tuple[float, float, float]:
    """Corpus BLEU and a 95% bootstrap interval (Koehn 2004): resample sentences with replacement.

    Sentence-level sufficient statistics are extracted once, so each resample is a sum, not a re-scoring.
    """
    if samples < 1:
        raise ValueError(f"bootstrap samples must be at least 1, not {samples}")
    bleu = BLEU()
    stats = np.array(bleu._extract_corpus_statistics(list(hypotheses), [list(references)]), dtype=np.int64)
    score = bleu._compute_score_from_stats(stats.sum(0).tolist()).score
    rng = random.Random(seed)
    n = len(stats)
    values = []
    for _ in range(samples):
        idx = [rng.randrange(n) for _ in range(n)]
        values.append(bleu._compute_score_from_stats(stats[idx].sum(0).tolist()).score)
    values.sort()
    return round(score, 2), round(values[int(0.025 * samples)], 2), round(values[int(0.975 * samples) - 1], 2)


def format_number(value: float | None, digits: int = 2) -> str:
    """A score for a table: `digits` decimals, or "-" where there is none."""
    return "-" if value is None else f"{value:.{digits}f}"
