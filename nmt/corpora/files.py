"""The user's own files: a TSV file or two line-aligned files per split, or one set split by hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

from nmt.corpora.corpus import Corpus, FileSpec, Pair
from nmt.corpora.text import read_parallel, read_tsv
from nmt.corpora.windows import add_window_splits, check_window
from nmt.errors import DataError


def _read_spec(spec: FileSpec, swap: bool) -> tuple[list[Pair], int]:
    if isinstance(spec, (str, Path)):
        return read_tsv(spec, swap=swap)
    if len(spec) != 2:
        raise DataError(f"{list(spec)}: give one TSV file or a pair [source_file, target_file]")
    pairs, n_dropped = read_parallel(spec[0], spec[1])
    return ([(tgt, src) for src, tgt in pairs] if swap else pairs), n_dropped


def _source_hash_percent(src: str) -> float:
    """Where a source sentence falls in [0, 100): equal sentences always fall together."""
    return int(hashlib.sha256(src.encode()).hexdigest()[:12], 16) / 16**12 * 100


def load_files(
    train: FileSpec,
    valid: FileSpec | None = None,
    test: FileSpec | None = None,
    src_lang: str = "src",
    tgt_lang: str = "tgt",
    swap: bool = False,
    valid_percent: float = 5.0,
    test_percent: float = 5.0,
    window: int = 1,
    window_test: int | None = None,
) -> Corpus:
    """A corpus from TSV or parallel files; a missing valid/test set is split off train by source hash.

    `window` K > 1: training joins 1..K pairs of a fresh shuffle each epoch, and valid and test get
    `<split>_k1..<split>_k<window_test or K>` (their pairs in file order joined k at a time; nmt.corpora.windows).
    """
    largest = check_window(window, window_test, "pairs")
    if valid_percent < 0 or test_percent < 0 or valid_percent + test_percent >= 100:
        raise DataError(
            f"valid_percent={valid_percent}, test_percent={test_percent}: "
            "use non-negative values that sum to less than 100"
        )
    train_pairs, n_empty = _read_spec(train, swap)
    if not train_pairs:
        names = train if isinstance(train, (str, Path)) else " + ".join(str(f) for f in train)
        raise DataError(
            f"{names}: no sentence pairs in the training data (every line has an empty side); check the files"
        )
    splits: dict[str, list[Pair]] = {"train": [], "valid": [], "test": []}
    for name, spec in (("valid", valid), ("test", test)):
        if spec is not None:
            splits[name], n = _read_spec(spec, swap)
            n_empty += n
    # Bands of the hash space: test first, then valid; only for the sets the user did not give.
    test_band = test_percent if test is None else 0.0
    valid_band = test_band + (valid_percent if valid is None else 0.0)
    for pair in train_pairs:
        h = _source_hash_percent(pair[0])
        splits["test" if h < test_band else "valid" if h < valid_band else "train"].append(pair)
    splits = add_window_splits(splits, {}, largest)
    return Corpus("files", src_lang, tgt_lang, splits, {"empty": n_empty} if n_empty else {}, window=window)
