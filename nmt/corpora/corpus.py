"""The shape every corpus reader returns: sentence pairs by split, and what was dropped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

Pair = tuple[str, str]
PathLike = str | Path
FileSpec = PathLike | Sequence[PathLike]  # a TSV file, or [source file, target file]


@dataclass
class Corpus:
    """Sentence pairs split into "train", "valid", "test" (and possibly more test sets)."""

    name: str
    src_lang: str
    tgt_lang: str
    splits: dict[str, list[Pair]]
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> pairs dropped
    # Bible only: a chapter number per pair of a split (book * 1000 + chapter), consecutive verses in order;
    # the largest number of pairs joined into one training example (1: single pairs; data.window), consecutive
    # verses of a chapter where the training split has chapters, else consecutive pairs of a fresh shuffle
    chapters: dict[str, list[int]] = field(default_factory=dict)
    window: int = 1
