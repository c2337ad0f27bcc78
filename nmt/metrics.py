"""Translation quality with sacrebleu on detokenized text: BLEU, chrF and TER with their signatures,
BLEU by source length (in whitespace words), and bootstrap confidence intervals.

    scores = corpus_scores(hypotheses, references)      # {"bleu": 31.2, "chrf": 55.0, "ter": ..., "signatures": ...}
    rows = bleu_by_length(sources, hypotheses, references, edges=(0, 10, 20, 30, 40, 50))
    stats = bleu_statistics(hypotheses, references)     # (N, 10): BLEU's sufficient statistics per sentence
    bleu, low, high = bootstrap_bleu(hypotheses, references, samples=1000)

The bootstraps resample BLEU's per-sentence statistics, which are computed here (sacrebleu's public 13a
tokenizer, then n-gram counts) rather than through sacrebleu's private methods; `bleu_from_statistics`
gives the same number as sacrebleu's default corpus BLEU (13a, case-sensitive, exp smoothing, n <= 4).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from nmt.errors import ConfigError

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


def check_edges(edges: object, option: str = "bucket edges") -> list[int]:
    """`edges` as a list when they are whole word counts that start at 0 and are strictly increasing, else a
    ConfigError naming `option` (e.g. "--buckets", "trainer.length_buckets")."""
    values = list(edges) if isinstance(edges, (list, tuple)) else []
    whole = all(isinstance(e, int) and not isinstance(e, bool) for e in values)
    if not values or not whole or values != sorted(set(values)) or values[0] != 0:
        shown = ",".join(map(str, values)) if values else repr(edges)
        raise ConfigError(
            f"{option}: bucket edges must be strictly increasing word counts starting at 0, "
            f"e.g. 0,15,25,35; not {shown}"
        )
    return values


def bucket_of(n_words: int, edges: Sequence[int]) -> int:
    """Index of the bucket holding a sentence of `n_words` words (lower edge inclusive)."""
    check_edges(edges)
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


ORDER = 4  # BLEU's largest n-gram
_TOKENIZE = Tokenizer13a()


def _ngrams(tokens: list[str]) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for n in range(1, ORDER + 1) for i in range(len(tokens) - n + 1))


@lru_cache(maxsize=4096)
def _reference(ref: str) -> tuple[int, Counter]:
    """A reference's length in tokens and its n-gram counts (shared: read, never change them). A study scores every
    run and decoding against the same references: each is tokenized and counted once while it stays in the cache."""
    tokens = _TOKENIZE(ref.rstrip()).split()
    return len(tokens), _ngrams(tokens)


def bleu_statistics(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """BLEU's sufficient statistics per sentence, (N, 2 + 2 * ORDER) int64: hypothesis length, reference
    length, matched n-grams for n = 1..4 (clipped by the reference's counts), hypothesis n-grams n = 1..4.

    Tokenized as sacrebleu's default BLEU does (13a, case kept, trailing whitespace dropped); one reference
    per sentence. Summed over any subset of sentences, they give that subset's corpus BLEU.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    stats = np.zeros((len(hypotheses), 2 + 2 * ORDER), dtype=np.int64)
    for row, (hyp, ref) in zip(stats, zip(hypotheses, references, strict=True), strict=True):
        h = _TOKENIZE(hyp.rstrip()).split()
        row[1], ref_counts = _reference(ref)
        row[0] = len(h)
        for gram, count in _ngrams(h).items():
            row[2 + ORDER + len(gram) - 1] += count
            row[2 + len(gram) - 1] += min(count, ref_counts.get(gram, 0))
    return stats


def bleu_from_statistics(stats: np.ndarray) -> np.ndarray:
    """Corpus BLEU (0-100) from summed statistics: stats (..., 10) -> BLEU (...), float64.

    sacrebleu's default formula: geometric mean of the four n-gram precisions, an order with no match
    counting as 1 / (2^j * total) for its j-th such order ("exp" smoothing), 0 when there is no match at all
    or an order has no n-grams, times the brevity penalty exp(1 - ref/hyp) when hyp < ref.
    """
    s = np.asarray(stats, dtype=np.float64)
    hyp, ref = s[..., 0], s[..., 1]
    correct, total = s[..., 2 : 2 + ORDER], s[..., 2 + ORDER :]  # (..., 4) each
    zero = correct == 0
    halvings = np.cumsum(zero, axis=-1)  # the j-th order without a match counts 1 / 2^j
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(zero, 100.0 / (2.0**halvings * total), 100.0 * correct / total)  # (..., 4)
        score = np.exp(np.log(precision).sum(axis=-1) / ORDER)
        penalty = np.where(hyp < ref, np.exp(1 - ref / hyp), 1.0)
        defined = (total > 0).all(axis=-1) & ~zero.all(axis=-1) & (hyp > 0)
        return np.where(defined, score * penalty, 0.0)


def resample_counts(n: int, samples: int, rng: np.random.Generator) -> np.ndarray:
    """`samples` bootstrap resamples of n items as counts: (samples, n), each row sums to n."""
    idx = rng.integers(0, n, size=(samples, n))  # (samples, n) drawn with replacement
    rows = np.arange(samples)[:, None] * n
    return np.bincount((idx + rows).ravel(), minlength=samples * n).reshape(samples, n)


def bootstrap_scores(seed_stats: Sequence[np.ndarray], samples: int = 1000, seed: int = 12345) -> np.ndarray:
    """BLEU over seeds x sentences resamples: `seed_stats` holds one (N, 10) array per seed (the same N
    sentences); each of the `samples` replicates resamples the sentences (the same draw for every seed) and
    the seeds, both with replacement, and takes the mean over the drawn seeds of their corpus BLEU on the
    drawn sentences -> (samples,). With one seed it is the plain bootstrap of Koehn (2004).

    The sentence draws depend only on (N, samples, seed), so every system scored with the same seed gets the
    same resampled test sets: their intervals are paired.
    """
    if samples < 1:
        raise ValueError(f"bootstrap samples must be at least 1, not {samples}")
    rng = np.random.default_rng(seed)
    counts = resample_counts(len(seed_stats[0]), samples, rng).astype(np.float64)  # (samples, N)
    per_seed = np.stack([bleu_from_statistics(counts @ s) for s in seed_stats], axis=1)  # (samples, R)
    drawn = resample_counts(len(seed_stats), samples, rng)  # (samples, R): times each seed was drawn
    return (per_seed * drawn).sum(axis=1) / len(seed_stats)


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile interval of bootstrap values: (low, high)."""
    low, high = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def bootstrap_bleu(
    hypotheses: Sequence[str], references: Sequence[str], samples: int = 1000, seed: int = 12345
) -> tuple[float, float, float]:
    """Corpus BLEU and a 95% bootstrap interval (Koehn 2004): resample sentences with replacement.

    Sentence-level sufficient statistics are extracted once, so each resample is a sum, not a re-scoring.
    """
    stats = bleu_statistics(hypotheses, references)
    low, high = percentile_interval(bootstrap_scores([stats], samples, seed))
    return round(float(bleu_from_statistics(stats.sum(0))), 2), round(low, 2), round(high, 2)


def format_number(value: float | None, digits: int = 2) -> str:
    """A score for a table: `digits` decimals, or "-" where there is none."""
    return "-" if value is None else f"{value:.{digits}f}"
