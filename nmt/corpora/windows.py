"""The length probe of the bottleneck study: evaluation pairs joined k at a time, the content held fixed.

`data.window=K` (every corpus but the synthetic one): training examples join 1..K pairs (drawn anew each
epoch: nmt.data.PreparedData.train_split), and every evaluation split `<split>` (valid and each test set)
gets one set per k = 1..K_test, `<split>_k<k>`: the split's pairs in file order cut into windows of exactly
k (a unit's last window holds what is left), sources and targets joined with a space. Every k therefore holds
the same reference words; only how many of them share one input changes. A unit is what a window may not
cross: a Bible chapter, or (captions, the user's files) the whole split.

`data.window_test` (None: K) may exceed K, to measure lengths never seen in training.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from nmt.corpora.corpus import Pair
from nmt.errors import DataError


def check_window(window: int, window_test: int | None, unit: str) -> int:
    """The largest test window (window_test, or `window` when None), after checking both are positive."""
    if window < 1:
        raise DataError(
            f"data.window={window}: give the largest number of consecutive {unit} in one example (1: single {unit})"
        )
    if window_test is not None and window_test < 1:
        raise DataError(
            f"data.window_test={window_test}: give the largest number of {unit} joined in one test input "
            "(null: data.window)"
        )
    return window if window_test is None else window_test


def window_sizes(units: Sequence[int], k: int) -> list[int]:
    """How many consecutive pairs each window of `k` holds, in order: k, ..., k, then a unit's rest."""
    if k < 1:
        raise ValueError(f"window size {k}: use 1 or more")
    sizes = []
    for _, run in itertools.groupby(units):
        n = len(list(run))
        sizes += [k] * (n // k) + ([n % k] if n % k else [])
    return sizes


def windows(pairs: Sequence[Pair], units: Sequence[int], k: int) -> list[Pair]:
    """Each unit's consecutive pairs cut into windows of `k` (window_sizes), sources and targets joined with
    a space.

    A unit's last window holds the n mod k pairs left over, so every k gives the same pairs and the
    same reference words: only how many pairs share one input changes.
    """
    out, start = [], 0
    for size in window_sizes(units[: len(pairs)], k):
        window = pairs[start : start + size]
        out.append((" ".join(s for s, _ in window), " ".join(t for _, t in window)))
        start += size
    return out


def add_window_splits(
    splits: dict[str, list[Pair]], units: dict[str, list[int]], largest: int
) -> dict[str, list[Pair]]:
    """`splits` with `<split>_k1..<split>_k<largest>` added for every split but train (none when largest is 1).
    `units[split]` (optional) holds a unit number per pair; without it the whole split is one unit."""
    if largest <= 1:
        return splits
    out = dict(splits)
    for name, pairs in splits.items():
        if name == "train":
            continue
        split_units = units.get(name) or [0] * len(pairs)
        for k in range(1, largest + 1):
            out[f"{name}_k{k}"] = windows(pairs, split_units, k)
    return out
