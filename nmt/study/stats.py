"""The bottleneck study's statistics, from BLEU's per-item sufficient statistics and resampling weights
(nmt.study.resampling says what is drawn at each k).

    out = Output.of(hypotheses, references, source_words)          # one run's translations of one set
    cell = seed_cell([out_seed1, out_seed2, out_seed3], weights)   # seed mean, t-interval, test-set interval
    cell = paired_cell([(sys1, base1), (sys2, base2)], weights)    # one test per seed pair, combined
    add_holm(cells, samples)                                       # Holm over a family; significance
    format_p(cell["p_holm"], samples)                              # "0.010": never below the p it shows

Two sources of variation, reported apart:
- the seeds: a model's S seeds are S training runs; their mean BLEU gets a t-interval on S - 1 degrees of
  freedom (mean +- t * sd / sqrt(S)). A percentile bootstrap over three seeds can give only 10 distinct
  resamples and never reaches beyond the seeds' range, so the seeds are not resampled.
- the test set: the seed mean's BLEU over bootstrap draws of the test units (captions, windows, blocks),
  a 95% percentile interval ("test interval"). It says how much another test set of the same kind could move
  the figure, for these trained models.

Paired test (per seed pair, a system against the baseline on the same draws): sacrebleu's paired bootstrap
rule (significance._paired_bs_test, two-sided): p = (1 + m) / (B + 1), m = #{b: |d_b| - mean|d| > |d|},
where d is the observed BLEU difference and d_b its resampled values. A cell combines its seed pairs by
intersection-union: the largest of their p-values, significant only when every seed pair's difference has
the same sign; Holm's step-down correction runs over a family of such cells (every k and every model).

Every p is an integer over B + 1 and is kept exact (fractions.Fraction): Holm's multiples, the comparison
with ALPHA, and the printed value, which is rounded up to 10^-d with d = floor(log10(B + 1)) decimals (3 for
B = 1000..9998, 4 for B = 9999..99998), so a p is never shown lower than it is (10/1001 prints as 0.010).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from nmt.metrics import bleu_from_statistics, bleu_statistics, percentile_interval
from nmt.study.resampling import bleu_draws

BASELINE = "none"  # the attention every other model is tested against
SEED = 12345  # the resampling seed (sacrebleu's default SACREBLEU_SEED): systems on the same items share draws
MIN_SAMPLES = 1000
ALPHA = Fraction(1, 20)
LEVEL = 0.95


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

    def bleu(self, idx: Sequence[int] | np.ndarray | None = None) -> float:
        """Corpus BLEU of the items `idx` (all when None)."""
        stats = self.stats if idx is None else self.stats[np.asarray(idx, dtype=np.int64)]
        return float(bleu_from_statistics(stats.sum(0)))


# ---------------------------------------------------------------------------------------------- p-values
def paired_p(system: np.ndarray, baseline: np.ndarray, observed: float) -> Fraction:
    """sacrebleu's two-sided paired bootstrap p-value, exact, from the (B,) resampled BLEU of a system and
    its baseline on the same draws and the observed difference (system - baseline on all items).
    An observed difference of exactly 0 is no evidence of a difference: p = 1."""
    if observed == 0:
        return Fraction(1)
    diffs = np.abs(system - baseline)
    count = int(np.sum(diffs - diffs.mean() > abs(observed)))
    return Fraction(count + 1, len(diffs) + 1)


def exact_p(p: float | Fraction, samples: int) -> Fraction:
    """A p-value of B = `samples` resamples as the fraction it is: every p here is an integer over B + 1
    (Holm's multiples, capped at 1, too), so the nearest such fraction to a float is the p it was."""
    return p if isinstance(p, Fraction) else Fraction(p).limit_denominator(samples + 1)


def p_digits(samples: int) -> int:
    """Decimals a p-value of B resamples is printed with: floor(log10(B + 1)), in integers."""
    return len(str(samples + 1)) - 1


def format_p(p: float | Fraction | None, samples: int) -> str:
    """A p-value rounded up to p_digits(B) decimals, computed in integers: never shown lower than it is."""
    if p is None:
        return "-"
    exact, d = exact_p(p, samples), p_digits(samples)
    scaled = -((-exact.numerator * 10**d) // exact.denominator)  # ceil(p * 10^d)
    return f"{scaled // 10**d}.{scaled % 10**d:0{d}d}"


def combine(deltas: Sequence[float], ps: Sequence[Fraction]) -> dict:
    """One cell's verdict over its seed pairs: {"delta": mean difference, "deltas", "ci_seeds": the mean
    difference's t-interval over the seed pairs (None for one), "p_seeds", "p": the largest p
    (intersection-union), "seeds_agree": every difference has the same, non-zero sign}."""
    agree = all(d > 0 for d in deltas) or all(d < 0 for d in deltas)
    return {
        "delta": float(np.mean(deltas)),
        "deltas": [float(d) for d in deltas],
        "ci_seeds": _pair(t_interval(deltas)),
        "p_seeds": [float(p) for p in ps],
        "p": float(max(ps)),
        "seeds_agree": agree,
    }


def holm(ps: Sequence[Fraction]) -> list[Fraction]:
    """Holm's step-down adjusted p-values, exact, in the order given: the i-th smallest p times (m - i),
    made non-decreasing in that order, capped at 1."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted = [Fraction(0)] * m
    running = Fraction(0)
    for rank, i in enumerate(order):
        running = max(running, min(Fraction(1), (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def add_holm(cells: Sequence[dict], samples: int) -> None:
    """Give every cell (combine's dict) "p_holm" over the family `cells` and "significant": seeds agree and
    p_holm < ALPHA, decided on the exact fractions."""
    adjusted = holm([exact_p(c["p"], samples) for c in cells])
    for cell, p in zip(cells, adjusted, strict=True):
        cell["p_holm"] = float(p)
        cell["significant"] = bool(cell["seeds_agree"] and p < ALPHA)


# ------------------------------------------------------------------------------------------- the seeds
def _t_two_sided(x: float, df: int) -> float:
    """P(|T| <= x) for Student's t with integer `df` (Abramowitz & Stegun 26.7.3, exact finite series)."""
    theta = math.atan(x / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ... up to c^(df-3)))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for j in range(1, (df - 1) // 2):
            term *= 2 * j / (2 * j + 1) * c2
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))
    for j in range(1, df // 2):
        term *= (2 * j - 1) / (2 * j) * c2
        total += term
    return math.sin(theta) * total


@lru_cache(maxsize=64)
def t_quantile(df: int, level: float = LEVEL) -> float:
    """The x with P(|T| <= x) = level for Student's t on `df` degrees of freedom (e.g. 4.303 for df 2)."""
    if df < 1:
        raise ValueError(f"t quantile: {df} degrees of freedom; need at least 1")
    low, high = 0.0, 1.0
    while _t_two_sided(high, df) < level:
        low, high = high, 2 * high
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_two_sided(mid, df) < level else (low, mid)
    return (low + high) / 2


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    """The mean's t-interval over independent values (seeds): mean +- t(n - 1) sd / sqrt(n); None for one."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return None
    half = t_quantile(len(v) - 1, level) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return float(v.mean()) - half, float(v.mean()) + half


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    """An interval as study.json stores it: unrounded (a table rounds once, when it prints)."""
    return None if interval is None else [float(interval[0]), float(interval[1])]


# -------------------------------------------------------------------------------------------- the cells
def seed_cell(outputs: Sequence[Output], weights: np.ndarray) -> dict:
    """A model's BLEU on one set, one Output per seed: {"bleu": the seeds' mean, "seeds", "seed_bleu",
    "ci_seeds": t-interval over the seeds (None for one), "ci_test": the seed mean's percentile interval over
    the draws `weights`, "low"/"high": the row's interval (ci_seeds, or ci_test for one seed), "interval":
    which}, unrounded."""
    per_seed = [o.bleu() for o in outputs]
    over_seeds = t_interval(per_seed)
    over_test = percentile_interval(np.mean([bleu_draws(o.stats, weights) for o in outputs], 0))
    low, high = over_seeds or over_test
    return {
        "bleu": float(np.mean(per_seed)),
        "seeds": len(outputs),
        "seed_bleu": [float(b) for b in per_seed],
        "ci_seeds": _pair(over_seeds),
        "ci_test": _pair(over_test),
        "low": float(low),
        "high": float(high),
        "interval": "seeds" if over_seeds else "test",
    }


def paired_cell(pairs: Sequence[tuple[Output, Output]], weights: np.ndarray) -> dict:
    """Each (system, baseline) seed pair tested on the same draws, then combined (combine)."""
    deltas, ps = [], []
    for system, baseline in pairs:
        observed = system.bleu() - baseline.bleu()
        same = system.hypotheses == baseline.hypotheses
        deltas.append(observed)
        ps.append(
            Fraction(1)
            if same
            else paired_p(bleu_draws(system.stats, weights), bleu_draws(baseline.stats, weights), observed)
        )
    return combine(deltas, ps)


Blocks = tuple[np.ndarray, np.ndarray, np.ndarray]  # (k=1 items, their weights, k=K weights): block_weights


def ratio(short_long: tuple[Output, Output], items: np.ndarray) -> float:
    """BLEU(k=K) / BLEU(k=1) on the same captions: the k=1 `items` that the windows of K hold."""
    return short_long[1].bleu() / short_long[0].bleu(items)


def interaction(
    system: Sequence[tuple[Output, Output]], baseline: Sequence[tuple[Output, Output]], blocks: Blocks
) -> dict:
    """How much better a system holds its BLEU over length than the baseline: per seed, its ratio (k=K over
    k=1, `ratio`) minus the baseline's (same seed), averaged over seeds; a t-interval over the seeds'
    differences ("ci_seeds", None for one seed) and a percentile interval over draws of the test set's blocks
    of K captions, k=1 and k=K drawn together ("ci_test"). `system`, `baseline`: per seed (k=1, k=K).

    A draw in which some seed's BLEU at k=1 is 0 (a weak model on a small test set) has no ratio: the test
    interval is taken over the other draws, and "draws_undefined" counts those left out; where they are more
    than the interval's tail (2.5% of the draws) the interval would hide them, and "ci_test" is None."""
    items, w1, w_k = blocks

    def ratios(outs: Sequence[tuple[Output, Output]]) -> tuple[np.ndarray, np.ndarray]:
        point = np.array([ratio(o, items) for o in outs])
        short = np.stack([bleu_draws(a.stats[items], w1) for a, _ in outs], 1)  # (B, S)
        long = np.stack([bleu_draws(b.stats, w_k) for _, b in outs], 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return point, np.where(short > 0, long / np.where(short > 0, short, 1.0), np.nan)  # (S,), (B, S)

    (sys_point, sys_draws), (base_point, base_draws) = ratios(system), ratios(baseline)
    per_seed = sys_point - base_point
    differences = (sys_draws - base_draws).mean(1)  # (B,) nan where a seed's draw has no ratio
    defined = np.isfinite(differences)
    undefined = int((~defined).sum())
    enough = undefined <= (1 - LEVEL) / 2 * differences.size
    return {
        "ratio": float(np.mean(sys_point)),  # the system's and the baseline's mean ratio over these seed pairs
        "base_ratio": float(np.mean(base_point)),
        "difference": float(np.mean(per_seed)),
        "per_seed": [float(d) for d in per_seed],
        "ci_seeds": _pair(t_interval(per_seed)),
        "ci_test": _pair(percentile_interval(differences[defined])) if enough else None,
        "draws_undefined": undefined,
        "seeds": len(system),
    }
