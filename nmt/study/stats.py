"""The bottleneck study's statistics, from BLEU's per-item sufficient statistics and resampling weights.

    out = Output.of(hypotheses, references, source_words)          # one run's translations of one set
    draws = Draws.of(n_units, samples, seed)                        # bootstrap draws of the test set's units
    w = draws.weights(units, sizes)                                 # (B, items): each item's weight per draw
    p = paired_p(bleu_draws(sys.stats, w), bleu_draws(base.stats, w), observed)

Resampling follows the unit the test set was drawn by: a caption (Multi30k), a chapter (the Bible), else an
item. One draw of the units holds for every window size k, so a resample has the same captions at every k:
an item (a window of k captions) weighs the mean of its units' draw counts; at k = 1 on captions this is
exactly the plain bootstrap over sentences, the same draws as sacrebleu's paired test with the same seed.

Paired test (per seed pair, a system against the baseline on the same items): sacrebleu's paired bootstrap
rule (significance.PairedTest, test_type="bs", two-sided): p = (1 + #{b: |d_b| - mean|d| > |d|}) / (B + 1),
where d is the observed BLEU difference and d_b its resampled values. So the smallest p is 1 / (B + 1).

Seeds: a cell's verdict combines its seed pairs by intersection-union: the largest of their p-values, and
significant only when every seed pair's difference has the same sign. Holm's step-down correction runs over a
family of such combined p-values (every k and every model tested). p-values are decided unrounded and
printed with format_p, at the resolution the resampling allows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nmt.metrics import bleu_from_statistics, bleu_statistics, percentile_interval

BASELINE = "none"  # the attention every other model is tested against
SEED = 12345  # the resampling seed: every system scored on the same items gets the same draws
MIN_SAMPLES = 1000
ALPHA = 0.05


@dataclass
class Output:
    """One run's translations of one evaluated set, N items."""

    hypotheses: list[str]
    references: list[str]
    words: list[int]  # source words per item
    stats: np.ndarray  # (N, 10) BLEU statistics per item (nmt.metrics.bleu_statistics)

    @classmethod
    def of(cls, hypotheses: Sequence[str], references: Sequence[str], words: Sequence[int]) -> Output:
        return cls(list(hypotheses), list(references), list(words), bleu_statistics(hypotheses, references))

    def bleu(self, idx: Sequence[int] | None = None) -> float:
        """Corpus BLEU of the items `idx` (all when None)."""
        stats = self.stats if idx is None else self.stats[list(idx)]
        return float(bleu_from_statistics(stats.sum(0)))


# ------------------------------------------------------------------------------------------------ draws
@dataclass
class Draws:
    """B bootstrap draws of U units: counts (B, U), each row summing to U."""

    counts: np.ndarray

    @classmethod
    def of(cls, n_units: int, samples: int, seed: int = SEED) -> Draws:
        """Units drawn with replacement, as sacrebleu draws sentences (numpy's default_rng(seed).choice)."""
        rng = np.random.default_rng(seed)
        idx = rng.choice(n_units, size=(samples, n_units), replace=True)
        rows = np.arange(samples)[:, None] * n_units
        counts = np.bincount((idx + rows).ravel(), minlength=samples * n_units).reshape(samples, n_units)
        return cls(counts.astype(np.float64))

    @property
    def samples(self) -> int:
        return self.counts.shape[0]

    def weights(self, units: Sequence[int], sizes: Sequence[int] | None = None) -> np.ndarray:
        """(B, items): `units[i]` is the unit of base item i (e.g. its caption or chapter); `sizes` splits the
        base items, in order, into consecutive windows (None: one item each). An item weighs the mean draw
        count of its base items' units."""
        base = self.counts[:, np.asarray(units, dtype=np.int64)]  # (B, N)
        if sizes is None:
            return base
        sizes = np.asarray(sizes, dtype=np.int64)
        if sizes.sum() != base.shape[1]:
            raise ValueError(f"window sizes sum to {int(sizes.sum())}, not to the {base.shape[1]} base items")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return np.add.reduceat(base, starts, axis=1) / sizes


def bleu_draws(stats: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Corpus BLEU of every draw: (B,) from (N, 10) statistics and (B, N) weights."""
    return bleu_from_statistics(weights @ stats)


def seed_draws(n_seeds: int, samples: int, seed: int = SEED + 1) -> np.ndarray:
    """(B, S) how often each of S seeds is drawn in each replicate (with replacement)."""
    return Draws.of(n_seeds, samples, seed).counts


# ------------------------------------------------------------------------------------------------ tests
def paired_p(system: np.ndarray, baseline: np.ndarray, observed: float) -> float:
    """sacrebleu's two-sided paired bootstrap p-value from the (B,) resampled BLEU of a system and its
    baseline on the same draws, and the observed difference (system - baseline on all items).
    An observed difference of exactly 0 is no evidence of a difference: p = 1."""
    if observed == 0:
        return 1.0
    diffs = np.abs(system - baseline)
    count = int(np.sum(diffs - diffs.mean() > abs(observed)))
    return (count + 1) / (len(diffs) + 1)


def combine(deltas: Sequence[float], ps: Sequence[float]) -> dict:
    """One cell's verdict over its seed pairs: {"delta": mean difference, "deltas", "p_seeds", "p": the
    largest p (intersection-union), "seeds_agree": every difference has the same, non-zero sign}."""
    agree = all(d > 0 for d in deltas) or all(d < 0 for d in deltas)
    return {
        "delta": round(float(np.mean(deltas)), 2),
        "deltas": [round(float(d), 2) for d in deltas],
        "p_seeds": [float(p) for p in ps],
        "p": float(max(ps)),
        "seeds_agree": agree,
    }


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p times (m - i), made
    non-decreasing in that order, capped at 1."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def add_holm(cells: Sequence[dict]) -> None:
    """Give every cell (combine's dict) "p_holm" over the family `cells` and "significant": seeds agree and
    p_holm < ALPHA (decided on the unrounded values)."""
    for cell, adjusted in zip(cells, holm([c["p"] for c in cells]), strict=True):
        cell["p_holm"] = adjusted
        cell["significant"] = bool(cell["seeds_agree"] and adjusted < ALPHA)


def format_p(p: float | None, samples: int) -> str:
    """A p-value at the resolution B resamples allow (1 / (B + 1)): "< 0.001" below it (B = 1000), else
    truncated, never rounded up across a threshold (0.04995 prints as 0.049)."""
    if p is None:
        return "-"
    digits = max(3, math.ceil(math.log10(samples + 1)) - 1)  # 3 for B = 1000 (p >= 1/1001), 4 for 10,000
    floor = 10.0**-digits
    if p < floor:
        return f"< {floor:.{digits}f}"
    return f"{math.floor(p / floor) * floor:.{digits}f}"


# ---------------------------------------------------------------------------------------- seed cells
def seed_interval(per_seed_draws: np.ndarray, seeds: np.ndarray | None) -> tuple[float, float]:
    """95% interval of the seeds' mean from (B, S) per-seed draws, the seeds resampled by `seeds` (B, S)
    counts (None: not resampled, e.g. one seed)."""
    S = per_seed_draws.shape[1]
    values = per_seed_draws.mean(1) if seeds is None else (per_seed_draws * seeds).sum(1) / S
    return percentile_interval(values)


def seed_cell(outputs: Sequence[Output], weights: np.ndarray, seeds: np.ndarray | None) -> dict:
    """A model's BLEU on one set, one Output per seed: {"bleu": the seeds' mean, "low", "high": 95% interval
    over the draws (`weights`) and the seeds, "seed_bleu": per seed} (2 decimals)."""
    per_seed = [o.bleu() for o in outputs]
    low, high = seed_interval(np.stack([bleu_draws(o.stats, weights) for o in outputs], 1), seeds)
    return {
        "bleu": round(float(np.mean(per_seed)), 2),
        "low": round(low, 2),
        "high": round(high, 2),
        "seed_bleu": [round(b, 2) for b in per_seed],
    }


def paired_cell(pairs: Sequence[tuple[Output, Output]], weights: np.ndarray) -> dict:
    """Each (system, baseline) seed pair tested on the same draws, then combined (combine)."""
    deltas, ps = [], []
    for system, baseline in pairs:
        observed = system.bleu() - baseline.bleu()
        same = system.hypotheses == baseline.hypotheses
        deltas.append(observed)
        ps.append(
            1.0 if same else paired_p(bleu_draws(system.stats, weights), bleu_draws(baseline.stats, weights), observed)
        )
    return combine(deltas, ps)


def interaction(
    system: Sequence[tuple[Output, Output]],
    baseline: Sequence[tuple[Output, Output]],
    weights: tuple[np.ndarray, np.ndarray],
    seeds: np.ndarray | None,
) -> dict:
    """How much better a system holds its BLEU over length than the baseline: per seed, its ratio
    BLEU(k=K) / BLEU(k=1) minus the baseline's ratio (same seed), averaged over seeds; with a 95% interval
    that resamples the units (`weights` for k=1 and k=K, from one draw) and the seeds (`seeds`, (B, S),
    shared by both models: the seeds are paired). `system`, `baseline`: per seed (Output at k=1, at k=K)."""

    def ratios(outs: Sequence[tuple[Output, Output]]) -> tuple[np.ndarray, np.ndarray]:
        point = np.array([short_long[1].bleu() / short_long[0].bleu() for short_long in outs])
        draws = np.stack([bleu_draws(b.stats, weights[1]) / bleu_draws(a.stats, weights[0]) for a, b in outs], 1)
        return point, draws

    (sys_point, sys_draws), (base_point, base_draws) = ratios(system), ratios(baseline)
    diff_draws = sys_draws - base_draws  # (B, S)
    low, high = seed_interval(diff_draws, seeds)
    return {
        "difference": round(float(np.mean(sys_point - base_point)), 3),
        "per_seed": [round(float(d), 3) for d in sys_point - base_point],
        "ci95": [round(low, 3), round(high, 3)],
        "seeds": len(system),
    }
