"""The length probe of the bottleneck study: evaluation pairs joined k at a time, the content held fixed.

`data.window=K` (every corpus but the synthetic one): training examples join 1..K pairs (drawn anew each
epoch: nmt.data.PreparedData.train_split), and every evaluation split `<split>` (valid and each test set)
gets one set per k = 1..K_test, `<split>_k<k>`: the split's pairs in file order cut into windows of exactly
k, sources and targets joined with a space; a unit's last n mod k pairs, too few for a window, are left out
(left_out counts them; the study reports them). So every k holds the same reference words but for fewer than k
pairs a unit (on test2016's 1,000 captions: one caption at k=3, none at k=2, 4 and 5), and only how many of
them share one input changes. A unit is what a window may not cross: a Bible chapter, or (captions, the
user's files) the whole split. Training windows are drawn elsewhere (nmt.data.window_split: 1..K pairs).

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


def window_starts(units: Sequence[int], k: int) -> list[int]:
    """Where each window of exactly `k` consecutive pairs starts, in order: every unit (a run of equal
    numbers in `units`) cut from its first pair, its last n mod k pairs left out."""
    if k < 1:
        raise ValueError(f"window size {k}: use 1 or more")
    starts, first = [], 0
    for _, run in itertools.groupby(units):
        n = len(list(run))
        starts += range(first, first + n - n % k, k)
        first += n
    return starts


def left_out(units: Sequence[int], k: int) -> int:
    """How many pairs no window of exactly `k` holds (each unit's last n mod k)."""
    return len(units) - k * len(window_starts(units, k))


def windows(pairs: Sequence[Pair], units: Sequence[int], k: int) -> list[Pair]:
    """Each unit's consecutive pairs cut into windows of exactly `k` (window_starts), sources and targets
    joined with a space; a unit's last n mod k pairs are left out."""
    return [
        (" ".join(s for s, _ in pairs[i : i + k]), " ".join(t for _, t in pairs[i : i + k]))
        for i in window_starts(units[: len(pairs)], k)
    ]


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
