"""Resampling a study's test set: which items are drawn together, and each item's weight in every draw.

    clusters = window_clusters(starts, k, units)          # (windows,) the resampling unit of each window of k
    w = Draws.of(clusters.max() + 1, samples, seed).weights(clusters)   # (B, windows): each window's weight
    bleu = bleu_draws(output.stats, w)                    # (B,) corpus BLEU of every draw
    w1, wK = block_weights(starts_K, K, units, n_single, samples, seed) # k=1 and k=K on the same blocks

Per window size k the unit is the window: the windows of k are drawn with replacement, each with all of its
sufficient statistics, exactly as sacrebleu's paired bootstrap draws sentences (numpy's
default_rng(seed).choice over the windows), so at every k the spread is that of the windows themselves. A
window is never split: weighing a window by the mean draw count of its captions (one caption draw for every
k) would average away the variation between the captions inside it and shrink the spread by about sqrt(k)
(tests/test_study_stats.py measures both). Where a window cannot be drawn alone (a Bible chapter: the test set
was drawn by chapter, and windows stay inside one) the unit is the chapter, with every window in it.

The interaction compares k=1 with k=K, so both must be drawn together: the unit is a block of K captions,
one window of K and its K single captions (a chapter, with its windows and verses, on the Bible); a draw
weighs both sides of a block by its count. Captions that no window of exactly K holds are left out of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nmt.metrics import bleu_from_statistics


@dataclass
class Draws:
    """B bootstrap draws of U units: counts (B, U), each row summing to U."""

    counts: np.ndarray

    @classmethod
    def of(cls, n_units: int, samples: int, seed: int) -> Draws:
        """Units drawn with replacement, as sacrebleu draws sentences (numpy's default_rng(seed).choice)."""
        rng = np.random.default_rng(seed)
        idx = rng.choice(n_units, size=(samples, n_units), replace=True)
        rows = np.arange(samples)[:, None] * n_units
        counts = np.bincount((idx + rows).ravel(), minlength=samples * n_units).reshape(samples, n_units)
        return cls(counts.astype(np.float64))

    @property
    def samples(self) -> int:
        return self.counts.shape[0]

    def weights(self, cluster: Sequence[int] | np.ndarray) -> np.ndarray:
        """(B, items): item i weighs the draw count of its unit `cluster[i]`."""
        return self.counts[:, np.asarray(cluster, dtype=np.int64)]


def window_clusters(starts: Sequence[int], k: int, units: Sequence | None) -> np.ndarray:
    """(windows,) the resampling unit of each window of `k` base items starting at `starts` (in order): the
    window itself, or, where `units` (one per base item, e.g. its Bible chapter; None: each item its own)
    puts consecutive windows in one unit, that unit. Numbered 0.. in order."""
    starts = np.asarray(starts, dtype=np.int64)
    if units is None or len(starts) == 0:
        return np.arange(len(starts))
    u = np.asarray(units)
    # a new unit begins where a window's first item lies in another unit than the previous window's last
    new = np.ones(len(starts), dtype=bool)
    new[1:] = u[starts[1:]] != u[starts[:-1] + k - 1]
    return np.cumsum(new) - 1


def bleu_draws(stats: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Corpus BLEU of every draw: (B,) from (N, 10) statistics and (B, N) weights."""
    return bleu_from_statistics(weights @ stats.astype(np.float64))


def block_items(starts: Sequence[int], k: int) -> np.ndarray:
    """(windows * k,) the base items the windows of `k` at `starts` hold, in order (k=1 items of the blocks)."""
    starts = np.asarray(starts, dtype=np.int64)
    return (starts[:, None] + np.arange(k)[None, :]).ravel()


def block_weights(
    starts: Sequence[int], k: int, units: Sequence | None, samples: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(items, w1, wK): the base items that the windows of `k` hold (block_items), their weights (B, items)
    and the windows' weights (B, windows), from one draw of the blocks (window_clusters): each block's k
    single items weigh what its window weighs."""
    cluster = window_clusters(starts, k, units)
    draws = Draws.of(int(cluster.max()) + 1 if len(cluster) else 0, samples, seed)
    w_k = draws.weights(cluster)
    return block_items(starts, k), np.repeat(w_k, k, axis=1), w_k
