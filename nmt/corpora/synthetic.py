"""Synthetic: reverse the sentence and translate word by word, an exactly learnable task."""

from __future__ import annotations

import random

from nmt.corpora.corpus import Corpus, Pair
from nmt.errors import DataError

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _pseudo_words(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    """n distinct pronounceable words of 2-3 consonant-vowel syllables, none of them in `taken`."""
    words: list[str] = []
    seen = set(taken)
    while len(words) < n:
        word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def load_synthetic(
    seed: int = 1,
    train_size: int = 20000,
    valid_size: int = 500,
    test_size: int = 1000,
    min_len: int = 3,
    max_len: int = 20,
    test_min_len: int = 3,
    test_max_len: int = 40,
    vocab_words: int = 40,
) -> Corpus:
    """Toy task: the target is the source reversed and mapped word by word through a fixed lexicon."""
    if not 1 <= vocab_words <= 10000:
        raise DataError(f"synthetic vocab_words={vocab_words}: use a value from 1 to 10000")
    if not (1 <= min_len <= max_len and 1 <= test_min_len <= test_max_len):
        raise DataError("synthetic lengths: need 1 <= min_len <= max_len and 1 <= test_min_len <= test_max_len")
    rng = random.Random(seed)  # a private generator: the data depend on the seed only
    source_words = _pseudo_words(rng, vocab_words, set())
    lexicon = dict(zip(source_words, _pseudo_words(rng, vocab_words, set(source_words)), strict=True))

    def sample(size: int, low: int, high: int) -> list[Pair]:
        pairs = []
        for _ in range(size):
            words = rng.choices(source_words, k=rng.randint(low, high))
            pairs.append((" ".join(words), " ".join(lexicon[w] for w in reversed(words))))
        return pairs

    splits = {
        "train": sample(train_size, min_len, max_len),
        "valid": sample(valid_size, min_len, max_len),
        "test": sample(test_size, test_min_len, test_max_len),
    }
    return Corpus("synthetic", "src", "tgt", splits, {})
