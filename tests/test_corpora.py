"""Tests for nmt.corpora: the file readers, their error messages, and the four corpora."""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt import corpora
from nmt.cli.common import compose_config
from nmt.corpora import (
    BIBLE_TRANSLATIONS,
    COPYRIGHTED_CODES,
    load_bible,
    load_files,
    load_multi30k,
    load_synthetic,
    multi30k,
    read_lines,
    read_parallel,
    read_tsv,
)
from nmt.corpora import bible as bible_module
from nmt.corpora.windows import add_window_splits, check_window, left_out, window_starts, windows
from nmt.errors import DataError

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
MULTI30K = SHARED_DATA / "multi30k"
TATOEBA = SHARED_DATA / "tatoeba_eng_fra" / "eng-fra.txt.gz"

# Text without line breaks or surrogates, as a line of a UTF-8 file can hold.
line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\ufeff"))


def write(path: Path, data: bytes) -> Path:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------------------------
# read_lines


@pytest.mark.parametrize("name", ["plain.txt", "packed.txt.gz"])
def test_read_lines_plain_and_gzip(tmp_path, name):
    path = write(tmp_path / name, b"eins\nzwei drei\n\nvier")
    assert read_lines(path) == ["eins", "zwei drei", "", "vier"]


def test_read_lines_strips_bom_and_crlf(tmp_path):
    path = write(tmp_path / "win.txt", b"\xef\xbb\xbfHallo\r\nWelt\r\n")
    assert read_lines(path) == ["Hallo", "Welt"]


def test_read_lines_empty_file(tmp_path):
    assert read_lines(write(tmp_path / "empty.txt", b"")) == []


@settings(max_examples=50, deadline=None)
@given(lines=st.lists(line_text, max_size=8), gz=st.booleans())
def test_read_lines_round_trips(tmp_path_factory, lines, gz):
    path = tmp_path_factory.mktemp("rt") / ("x.txt.gz" if gz else "x.txt")
    write(path, "".join(line + "\n" for line in lines).encode())
    assert read_lines(path) == lines


def test_read_lines_invalid_utf8_names_file_and_line(tmp_path):
    path = write(tmp_path / "latin.txt", b"ok\n\xff\xfe bad\n")
    with pytest.raises(DataError) as err:
        read_lines(path)
    message = str(err.value)
    assert str(path) in message and "line 2" in message and "iconv" in message and "\n" not in message


def test_read_lines_invalid_utf8_in_gzip(tmp_path):
    path = write(tmp_path / "latin.txt.gz", b"a\nb\nc\xe9\n")
    with pytest.raises(DataError, match="line 3"):
        read_lines(path)


def test_read_lines_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt: no such file; check data"):
        read_lines(tmp_path / "nope.txt")


def test_read_lines_directory(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        read_lines(tmp_path)


def test_read_lines_broken_gzip(tmp_path):
    path = tmp_path / "broken.gz"
    path.write_bytes(b"this is not gzip")
    with pytest.raises(DataError, match="broken.gz"):
        read_lines(path)


# ---------------------------------------------------------------------------------------------
# read_parallel and read_tsv


def test_read_parallel_pairs_cleans_and_drops_empty(tmp_path):
    src = write(tmp_path / "a.de.gz", b"Guten  Tag\n\n  Hallo \nx\n")
    tgt = write(tmp_path / "a.en", b"Good\tday\nnothing\nHello\n   \n")
    pairs, n_dropped = read_parallel(src, tgt)
    assert pairs == [("Guten Tag", "Good day"), ("Hallo", "Hello")]
    assert n_dropped == 2


def test_read_parallel_mismatch_names_both_files_and_counts(tmp_path):
    src = write(tmp_path / "s.txt", b"a\nb\nc\n")
    tgt = write(tmp_path / "t.txt", b"a\nb\n")
    with pytest.raises(DataError) as err:
        read_parallel(src, tgt)
    message = str(err.value)
    assert f"{src} has 3 lines" in message and f"{tgt} has 2" in message and "\n" not in message


def test_read_tsv_pairs_swap_and_drops(tmp_path):
    path = write(tmp_path / "d.tsv", b"Hi.\tSalut.\n\n \t \nGo.\t\nRun!\tCours !\n")
    pairs, n_dropped = read_tsv(path)
    assert pairs == [("Hi.", "Salut."), ("Run!", "Cours !")]
    assert n_dropped == 3
    assert read_tsv(path, swap=True)[0] == [("Salut.", "Hi."), ("Cours !", "Run!")]


@pytest.mark.parametrize("line, count", [("one column only", 1), ("a\tb\tc", 3)])
def test_read_tsv_wrong_columns_names_file_line_and_count(tmp_path, line, count):
    path = write(tmp_path / "bad.tsv", f"x\ty\n{line}\n".encode())
    with pytest.raises(DataError) as err:
        read_tsv(path)
    message = str(err.value)
    assert f"{path}, line 2" in message and f"found {count} tab-separated columns" in message


def test_read_tsv_empty_file(tmp_path):
    with pytest.raises(DataError, match="no sentence pairs"):
        read_tsv(write(tmp_path / "e.tsv", b"\n\n"))


@settings(max_examples=50, deadline=None)
@given(rows=st.lists(st.tuples(line_text, line_text), min_size=1, max_size=6))
def test_read_tsv_keeps_exactly_nonempty_pairs(tmp_path_factory, rows):
    rows = [(a.replace("\t", " "), b.replace("\t", " ")) for a, b in rows]
    path = tmp_path_factory.mktemp("tsv") / "p.tsv"
    write(path, "".join(f"{a}\t{b}\n" for a, b in rows).encode())
    expected = [(" ".join(a.split()), " ".join(b.split())) for a, b in rows]
    expected = [(a, b) for a, b in expected if a and b]
    if not expected:
        with pytest.raises(DataError):
            read_tsv(path)
        return
    pairs, n_dropped = read_tsv(path)
    assert pairs == expected and n_dropped == len(rows) - len(expected)


# ---------------------------------------------------------------------------------------------
# Bible


@pytest.fixture(scope="module")
def bible():
    start = time.perf_counter()
    corpus = load_bible()
    corpus.seconds = time.perf_counter() - start  # for the speed test; not part of Corpus
    return corpus


def test_bible_default_split_sizes(bible):
    sizes = {name: len(pairs) for name, pairs in bible.splits.items()}
    print("bible e->k", sizes, bible.dropped, f"{bible.seconds:.2f}s")
    assert bible.name == "bible-e-k" and (bible.src_lang, bible.tgt_lang) == ("de", "en")
    for name, expected in [("train", 27_660), ("valid", 1_760), ("test", 1_410)]:
        assert abs(sizes[name] - expected) <= 0.01 * expected, (name, sizes[name])
    assert abs(sum(sizes.values()) + bible.dropped["valid/test overlap with train"] - 30_920) <= 309


def test_bible_is_fast(bible):
    assert bible.seconds < 10


def test_bible_dropped_accounts_for_every_verse(bible):
    n_pairs = sum(len(pairs) for pairs in bible.splits.values())
    assert n_pairs + sum(bible.dropped.values()) == 31_102
    assert bible.dropped["psalm title"] == 150
    assert 0 < bible.dropped["length ratio"] < 0.005 * 31_102


def test_bible_valid_test_do_not_overlap_train(bible):
    train_src = {src for src, _ in bible.splits["train"]}
    train_tgt = {tgt for _, tgt in bible.splits["train"]}
    for name in ("valid", "test"):
        for src, tgt in bible.splits[name]:
            assert src not in train_src and tgt not in train_tgt


def test_bible_text_is_clean(bible):
    artefacts = re.compile(r"\(\d+:\d+[a-z]?\)|[\[\]*#`]|\s{2}|^\s|\s$")
    for pairs in bible.splits.values():
        for src, tgt in pairs:
            assert src and tgt
            assert not artefacts.search(src) and not artefacts.search(tgt), (src, tgt)


def test_bible_split_is_chapter_consistent(bible):
    # Map each KJV verse text that occurs once to its chapter; its split must be the chapter's.
    db = bible_module._bible_db(None)
    kjv, _ = bible_module._clean_translation("k", bible_module._read_translation(db, "k"))
    chapters: dict[str, list[tuple[int, int]]] = {}
    for (book, chapter, _), text in kjv.items():
        chapters.setdefault(text, []).append((book, chapter))
    checked = 0
    for name, pairs in bible.splits.items():
        for _, tgt in pairs:
            if len(chapters[tgt]) == 1:
                assert bible_module._chapter_split(*chapters[tgt][0]) == name
                checked += 1
    assert checked > 30_000


def test_bible_is_deterministic(bible):
    assert load_bible("e", "k").splits == bible.splits


def test_bible_french_pair_count():
    corpus = load_bible("l", "k")
    n_pairs = sum(len(p) for p in corpus.splits.values()) + corpus.dropped["valid/test overlap with train"]
    print("bible l->k", {k: len(v) for k, v in corpus.splits.items()}, corpus.dropped)
    assert abs(n_pairs - 30_914) <= 309 and corpus.src_lang == "fr"


def test_bible_copyrighted_code_is_refused():
    code = sorted(COPYRIGHTED_CODES)[0]
    with pytest.raises(DataError) as err:
        load_bible(code, "k")
    message = str(err.value)
    assert "copyrighted" in message and "refuses bulk copies" in message
    assert all(allowed in message for allowed in BIBLE_TRANSLATIONS)


def test_bible_unknown_code_lists_allowed_codes_with_languages():
    with pytest.raises(DataError) as err:
        load_bible("e", "x")
    message = str(err.value)
    assert "unknown Bible translation 'x'" in message and "k (en King James" in message and "n (ko" in message


def test_bible_same_code_is_refused():
    with pytest.raises(DataError, match="both 'e'"):
        load_bible("e", "e")


def test_bible_missing_db(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_bible(db_path=str(tmp_path / "bible.db"))


@pytest.mark.parametrize(
    "code, ref, raw, expected",
    [
        ("l", (19, 102, 27), "(102:26) Tu as  fondé la terre.", ("Tu as fondé la terre.", "")),
        ("l", (19, 2, 2), "(2:1) A. (2:2) B.", ("", "merged verse")),
        ("k", (19, 23, 1), "The LORD is my shepherd", ("", "psalm title")),
        ("3", (18, 34, 29), " ... ", ("", "placeholder")),
        ("n", (6, 2, 13), "12절과 상동", ("", "placeholder")),
        ("e", (44, 8, 37), "(MISSING) [KJV: ...]", ("", "placeholder")),
        ("4", (1, 1, 2), "God`s [own] Spirit * * *", ("God's own Spirit", "")),
        ("4", (19, 1, 6), "shall perish. Psalm 2", ("shall perish.", "")),
        ("5", (40, 1, 23), "Emmanuel» [Ésaïe 7:14], ce qui", ("Emmanuel», ce qui", "")),
        ("3", (18, 8, 9), "(8:1)", ("", "empty")),
        ("v", (1, 28, 17), "dijo: \u00adCuán", ("dijo: ¡Cuán", "")),
        ("v", (1, 1, 1), "EN el principio", ("En el principio", "")),
        ("v", (1, 6, 1), "Y ACONTECIO que", ("Y aconteció que", "")),
    ],
)
def test_bible_verse_cleaning_rules(code, ref, raw, expected):
    vocab = {"acontecio": "aconteció", "en": "en"}
    assert bible_module._clean_verse(code, ref, raw, vocab) == expected


def test_bible_korean_same_as_placeholder_drops_neighbours():
    verses = {(5, 6, v): f"verse {v}" for v in range(17, 22)}
    verses[(5, 6, 19)] = "(앞절과 동일)"
    kept, dropped = bible_module._clean_translation("n", verses)
    assert sorted(kept) == [(5, 6, 17), (5, 6, 21)]
    assert dropped == {(5, 6, 19): "placeholder", (5, 6, 18): "merged verse", (5, 6, 20): "merged verse"}


# ---------------------------------------------------------------------------------------------
# Multi30k

needs_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} not present")


@needs_multi30k
def test_multi30k_sizes_from_shared_folder():
    corpus = load_multi30k(str(MULTI30K))
    sizes = {name: len(pairs) for name, pairs in corpus.splits.items()}
    assert sizes == {
        "train": 29_000,
        "valid": 1_014,
        "test": 1_000,
        "test_2017_flickr": 1_000,
        "test_2017_mscoco": 461,
        "test_2018_flickr": 1_071,
    }
    assert (corpus.name, corpus.src_lang, corpus.tgt_lang) == ("multi30k-de-en", "de", "en")
    assert corpus.splits["train"][0][0].startswith("Zwei junge")


@needs_multi30k
def test_multi30k_english_to_french_direction():
    corpus = load_multi30k(str(MULTI30K), "en", "fr")
    assert corpus.splits["train"][0][0].startswith("Two young") and len(corpus.splits["valid"]) == 1_014


def test_multi30k_refuses_other_language_pairs(tmp_path):
    with pytest.raises(DataError, match="German or French"):
        load_multi30k(str(tmp_path), "de", "fr")


def test_multi30k_missing_file_in_root(tmp_path):
    write(tmp_path / "train.de.gz", b"")
    with pytest.raises(DataError, match=r"data\.root=.*: lacks train\.en\.gz, val\.de\.gz, val\.en\.gz \.\.\. \(11 of"):
        load_multi30k(str(tmp_path))


def test_a_data_root_that_is_not_there_is_refused_and_nothing_is_downloaded(tmp_path, monkeypatch):
    """A mistyped data.root is refused in one line, never taken as a reason to download (which would end by asking
    for the data.root that was passed)."""
    asked = []
    monkeypatch.setattr(multi30k.urllib.request, "urlopen", lambda url, timeout: asked.append(url))
    with pytest.raises(DataError) as err:
        load_multi30k(str(tmp_path / "multi30kk"), download_dir=str(tmp_path / "m30k"))
    assert str(err.value).startswith(f"data.root={tmp_path / 'multi30kk'}: no such folder; pass the folder that holds")
    assert asked == [] and not (tmp_path / "m30k").exists()


def test_sha256_verification_rejects_a_tampered_file(tmp_path):
    path = write(tmp_path / "val.de.gz", b"Ein Hund rennt.\n")
    good = hashlib.sha256(path.read_bytes()).hexdigest()
    multi30k._verify_sha256(path, good, str(path))  # passes silently
    path.write_bytes(b"Ein Hund rennt!\n")
    with pytest.raises(DataError) as err:
        multi30k._verify_sha256(path, good, str(path))
    assert str(path) in str(err.value) and "data.root=" in str(err.value)


def fake_urlopen(serve):
    """An offline stand-in for urllib.request.urlopen that serves serve(file name) as the body."""
    return lambda url, timeout: io.BytesIO(serve(url.rsplit("/", 1)[1]))


@needs_multi30k
def test_multi30k_download_checks_and_renames(tmp_path, monkeypatch):
    monkeypatch.setattr(multi30k.urllib.request, "urlopen", fake_urlopen(lambda f: (MULTI30K / f).read_bytes()))
    corpus = load_multi30k(None, "fr", "en", download_dir=str(tmp_path / "m30k"))
    assert len(corpus.splits["train"]) == 29_000
    assert sorted(p.name for p in (tmp_path / "m30k").iterdir()) == sorted(
        f"{stem}.{lang}.gz" for stem in multi30k._MULTI30K_SPLITS.values() for lang in ("fr", "en")
    )


def test_multi30k_download_rejects_a_bad_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(multi30k.urllib.request, "urlopen", fake_urlopen(lambda f: b"tampered"))
    with pytest.raises(DataError) as err:
        load_multi30k(None, download_dir=str(tmp_path / "m30k"))
    assert "sha256" in str(err.value) and "data.root=" in str(err.value)
    assert list((tmp_path / "m30k").iterdir()) == []  # no partial or unverified file is left behind


def test_multi30k_download_failure_says_what_to_do(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise multi30k.urllib.error.URLError("no network")

    monkeypatch.setattr(multi30k.urllib.request, "urlopen", offline)
    with pytest.raises(DataError, match="download failed .* by hand and pass data.root="):
        load_multi30k(None, download_dir=str(tmp_path))


@needs_multi30k
def test_multi30k_checksum_table_matches_shared_files():
    for file, expected in multi30k.MULTI30K_SHA256.items():
        multi30k._verify_sha256(MULTI30K / file, expected, file)


# ---------------------------------------------------------------------------------------------
# The user's own files


def assert_disjoint_by_source(corpus):
    sources = [{src for src, _ in corpus.splits[name]} for name in ("train", "valid", "test")]
    assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])


@pytest.mark.skipif(not TATOEBA.is_file(), reason=f"{TATOEBA} not present")
def test_files_tatoeba_tsv_splits_by_source():
    corpus = load_files(str(TATOEBA), src_lang="en", tgt_lang="fr")
    sizes = {name: len(pairs) for name, pairs in corpus.splits.items()}
    assert sum(sizes.values()) == 142_787 and corpus.dropped == {}
    for name in ("valid", "test"):
        assert 0.04 < sizes[name] / 142_787 < 0.06, sizes
    assert_disjoint_by_source(corpus)


def test_files_parallel_given_splits_and_swap(tmp_path):
    src = write(tmp_path / "train.de", b"a\nb\n\n")
    tgt = write(tmp_path / "train.en.gz", b"A\nB\nC\n")
    tsv = write(tmp_path / "dev.tsv", b"x\tX\n")
    corpus = load_files([str(src), str(tgt)], valid=str(tsv), test=str(tsv), swap=True)
    assert corpus.splits == {"train": [("A", "a"), ("B", "b")], "valid": [("X", "x")], "test": [("X", "x")]}
    assert corpus.dropped == {"empty": 1} and corpus.name == "files"


@settings(max_examples=30, deadline=None)
@given(sources=st.lists(st.sampled_from([f"s{i}" for i in range(60)]), min_size=1, max_size=200))
def test_files_hash_split_keeps_repeated_sources_together(tmp_path_factory, sources):
    path = tmp_path_factory.mktemp("files") / "c.tsv"
    write(path, "".join(f"{s}\tt{i}\n" for i, s in enumerate(sources)).encode())
    corpus = load_files(str(path), valid_percent=20, test_percent=20)
    assert sum(len(p) for p in corpus.splits.values()) == len(sources)
    assert_disjoint_by_source(corpus)


def test_files_bad_percentages(tmp_path):
    with pytest.raises(DataError, match="test_percent"):
        load_files(str(tmp_path / "x.tsv"), valid_percent=60, test_percent=50)


# ---------------------------------------------------------------------------------------------
# Synthetic


def test_synthetic_is_deterministic_and_seeded():
    small = {"train_size": 300, "valid_size": 20, "test_size": 50}
    assert load_synthetic(seed=3, **small).splits == load_synthetic(seed=3, **small).splits
    assert load_synthetic(seed=3, **small).splits != load_synthetic(seed=4, **small).splits


def test_synthetic_target_is_reversed_and_mapped():
    corpus = load_synthetic(seed=7)
    assert [len(corpus.splits[n]) for n in ("train", "valid", "test")] == [20_000, 500, 1_000]
    lexicon: dict[str, str] = {}
    for pairs in corpus.splits.values():
        for src, tgt in pairs:
            src_words, tgt_words = src.split(), tgt.split()
            assert len(src_words) == len(tgt_words)
            for s, t in zip(reversed(src_words), tgt_words, strict=True):
                assert lexicon.setdefault(s, t) == t  # one translation per source word
    assert len(lexicon) == 40 and len(set(lexicon.values())) == 40
    assert not set(lexicon) & set(lexicon.values())


def test_synthetic_test_sentences_are_longer_than_train():
    corpus = load_synthetic(seed=1, train_size=2000)
    train_lengths = [len(src.split()) for src, _ in corpus.splits["train"]]
    test_lengths = [len(src.split()) for src, _ in corpus.splits["test"]]
    assert min(train_lengths) == 3 and max(train_lengths) == 20
    assert max(test_lengths) > max(train_lengths)


def test_synthetic_is_fast():
    start = time.perf_counter()
    load_synthetic()
    assert time.perf_counter() - start < 1.0


def test_synthetic_bad_lengths():
    with pytest.raises(DataError, match="min_len"):
        load_synthetic(min_len=5, max_len=2)


@pytest.fixture(scope="module")
def bible_windows():
    return load_bible(window=3)


def test_bible_windows_keep_the_single_verse_splits_and_add_one_set_per_k(bible, bible_windows):
    for name in ("train", "valid", "test"):
        assert bible_windows.splits[name] == bible.splits[name]
        assert len(bible_windows.chapters[name]) == len(bible.splits[name])
    assert bible_windows.window == 3 and bible.window == 1 and "test_k1" not in bible.splits
    assert set(bible_windows.splits) == {"train", "valid", "test"} | {
        f"{s}_k{k}" for s in ("valid", "test") for k in (1, 2, 3)
    }


def test_bible_window_sets_hold_the_same_words_with_longer_inputs(bible_windows):
    """Every k-set of a held-out split has the same reference words in the same order, but for each chapter's
    last n mod k verses (left out); only the number of verses per input grows."""
    for split in ("valid", "test"):
        verses = bible_windows.splits[split]
        assert bible_windows.splits[f"{split}_k1"] == verses
        sizes = []
        for k in (1, 2, 3):
            windows = bible_windows.splits[f"{split}_k{k}"]
            units = bible_windows.chapters[split]
            kept = [verses[i + j] for i in window_starts(units, k) for j in range(k)]
            assert len(kept) == len(verses) - left_out(units, k) == k * len(windows)
            for side in (0, 1):
                assert " ".join(p[side] for p in windows).split() == " ".join(p[side] for p in kept).split()
            sizes.append(len(windows))
            chapters = len(set(units))
            assert (len(verses) - (k - 1) * chapters) / k <= len(windows) <= len(verses) / k  # a chapter's rest out
        assert sizes[0] > sizes[1] > sizes[2]


def test_verse_windows_stay_inside_a_chapter():
    pairs = [(f"s{i}", f"t{i}") for i in range(7)]
    assert corpora.verse_windows(pairs, [1, 1, 1, 2, 2, 2, 2], 2) == [
        ("s0 s1", "t0 t1"),
        ("s3 s4", "t3 t4"),
        ("s5 s6", "t5 t6"),
    ]


def test_bible_window_must_be_positive():
    with pytest.raises(DataError, match="data.window=0"):
        load_bible(window=0)


def test_numeric_bible_codes_from_the_command_line_are_codes(tmp_path):
    # Hydra parses data.source_translation=4 (World English Bible) as the integer 4; the schema makes it "4"
    cfg = compose_config(["data.source_translation=4", "data.target_translation=3"])
    assert (cfg.data.source_translation, cfg.data.target_translation) == ("4", "3")
    with pytest.raises(DataError, match="no such file"):  # past the code checks, at the database
        load_bible(4, "k", db_path=str(tmp_path / "bible.db"))


# ---------------------------------------------------------------------------------------------
# Windows of consecutive pairs (nmt.corpora.windows): every corpus's data.window / data.window_test


def words(pairs, side: int) -> list[str]:
    """The words of one side of `pairs`, in order."""
    return " ".join(p[side] for p in pairs).split()


def assert_window_sets(splits: dict, name: str, largest: int) -> None:
    """`<name>_k1..<name>_k<largest>`: k1 is the split itself, and every k holds floor(n / k) windows of exactly
    k pairs: the split's source and reference words in order, but for the last n mod k pairs (one unit: the
    whole split)."""
    pairs = splits[name]
    assert splits[f"{name}_k1"] == pairs
    assert f"{name}_k{largest + 1}" not in splits
    for k in range(1, largest + 1):
        sets = splits[f"{name}_k{k}"]
        kept = pairs[: len(pairs) - len(pairs) % k]
        assert len(sets) == len(pairs) // k and left_out([0] * len(pairs), k) == len(pairs) % k, (name, k)
        for side in (0, 1):
            assert words(sets, side) == words(kept, side), (name, k, side)


@settings(max_examples=100, deadline=None)
@given(
    runs=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    k=st.integers(1, 6),
    tokens=st.integers(1, 3),
)
def test_windows_cut_each_unit_in_order_into_windows_of_exactly_k(runs, k, tokens):
    """Units are runs of equal numbers (neighbouring runs differ); each unit's pairs are cut in file order into
    windows of exactly k, joined with one space, its last n mod k pairs left out (and counted); no window
    crosses a unit."""
    units = [u % 2 for u, n in enumerate(runs) for _ in range(n)]  # neighbours alternate: 0, 1, 0, ...
    pairs = [(" ".join(f"s{i}.{j}" for j in range(tokens)), f"t{i}") for i in range(len(units))]
    out = windows(pairs, units, k)
    expected, kept, start = [], [], 0
    for n in runs:
        for first in range(start, start + n - k + 1, k):
            window = pairs[first : first + k]
            expected.append((" ".join(s for s, _ in window), " ".join(t for _, t in window)))
            kept += window
        start += n
    assert out == expected
    assert len(out) == sum(n // k for n in runs) == len(window_starts(units, k))
    assert left_out(units, k) == sum(n % k for n in runs) == len(pairs) - len(kept)
    for side in (0, 1):
        assert words(out, side) == words(kept, side)
    assert windows(pairs, units, 1) == pairs and left_out(units, 1) == 0


def test_windows_refuse_a_size_below_one():
    with pytest.raises(ValueError, match="window size 0"):
        windows([("a", "A")], [0], 0)


@pytest.mark.parametrize("largest", [2, 4])
def test_add_window_splits_adds_one_set_per_k_for_every_split_but_train(largest):
    splits = {
        "train": [(f"a{i}", f"A{i}") for i in range(7)],
        "valid": [(f"b{i}", f"B{i}") for i in range(5)],
        "test": [(f"c{i} d{i}", f"C{i}") for i in range(6)],
        "test_extra": [("e", "E")],
    }
    units = {"test": [1, 1, 1, 2, 2, 2]}  # test in two units; the others one unit each
    out = add_window_splits(splits, units, largest)
    assert set(out) == set(splits) | {
        f"{s}_k{k}" for s in ("valid", "test", "test_extra") for k in range(1, largest + 1)
    }
    assert all(out[name] == pairs for name, pairs in splits.items())  # the splits themselves are unchanged
    assert not any(name.startswith("train_k") for name in out)
    for name in ("valid", "test_extra"):
        assert_window_sets(out, name, largest)
    for k in range(1, largest + 1):
        assert out[f"test_k{k}"] == windows(splits["test"], units["test"], k)
        assert len(out[f"test_k{k}"]) == 2 * (3 // k)  # no window crosses the unit boundary


def test_add_window_splits_adds_nothing_for_single_pairs():
    splits = {"train": [("a", "A")], "valid": [("b", "B")], "test": [("c", "C")]}
    assert add_window_splits(splits, {}, 1) == splits


def test_check_window_gives_the_largest_test_window():
    assert check_window(1, None, "pairs") == 1
    assert check_window(3, None, "pairs") == 3
    assert check_window(2, 5, "pairs") == 5
    assert check_window(4, 1, "pairs") == 1


@pytest.mark.parametrize(
    ("window", "window_test", "key"),
    [(0, None, "data.window=0"), (-1, 2, "data.window=-1"), (2, 0, "data.window_test=0")],
)
def test_check_window_errors_name_the_key(window, window_test, key):
    with pytest.raises(DataError, match=re.escape(key)) as err:
        check_window(window, window_test, "captions")
    assert "captions" in str(err.value)


@pytest.mark.parametrize(("window", "window_test", "key"), [(0, None, "data.window=0"), (2, 0, "data.window_test=0")])
def test_every_corpus_checks_its_window(tmp_path, window, window_test, key):
    with pytest.raises(DataError, match=re.escape(key)):
        load_multi30k(str(tmp_path), window=window, window_test=window_test)  # before looking for files
    with pytest.raises(DataError, match=re.escape(key)):
        load_files(str(tmp_path / "absent.tsv"), window=window, window_test=window_test)
    with pytest.raises(DataError, match=re.escape(key)):
        load_bible(window=window, window_test=window_test)


@pytest.fixture
def line_files(tmp_path):
    """Line-aligned training files and given valid and test files (TSV and a line-aligned pair)."""
    train_src = write(tmp_path / "train.de", "".join(f"quelle {i} hier\n" for i in range(30)).encode())
    train_tgt = write(tmp_path / "train.en", "".join(f"source {i}\n" for i in range(30)).encode())
    valid = write(tmp_path / "valid.tsv", "".join(f"v {i} q\tV {i}\n" for i in range(7)).encode())
    test_src = write(tmp_path / "test.de", "".join(f"t {i} a b\n" for i in range(10)).encode())
    test_tgt = write(tmp_path / "test.en.gz", "".join(f"T {i} c\n" for i in range(10)).encode())
    return {"train": [str(train_src), str(train_tgt)], "valid": str(valid), "test": [str(test_src), str(test_tgt)]}


def test_files_windows_add_one_set_per_k_for_valid_and_test(line_files):
    plain = load_files(**line_files)
    corpus = load_files(**line_files, window=3)
    assert corpus.window == 3 and plain.window == 1
    assert set(corpus.splits) == {"train", "valid", "test"} | {
        f"{s}_k{k}" for s in ("valid", "test") for k in (1, 2, 3)
    }
    for name in ("train", "valid", "test"):
        assert corpus.splits[name] == plain.splits[name]
    assert corpus.splits["test_k1"] == corpus.splits["test"]
    for name in ("valid", "test"):
        assert_window_sets(corpus.splits, name, 3)
    assert corpus.splits["test_k3"][0] == ("t 0 a b t 1 a b t 2 a b", "T 0 c T 1 c T 2 c")
    assert corpus.splits["test_k3"][-1] == ("t 6 a b t 7 a b t 8 a b", "T 6 c T 7 c T 8 c")  # pair 9 left out


def test_files_window_test_may_exceed_the_training_window(line_files):
    corpus = load_files(**line_files, window=2, window_test=5)
    assert corpus.window == 2
    assert set(corpus.splits) == {"train", "valid", "test"} | {
        f"{s}_k{k}" for s in ("valid", "test") for k in range(1, 6)
    }
    for name in ("valid", "test"):
        assert_window_sets(corpus.splits, name, 5)


def test_files_hash_split_sets_get_windows_too(tmp_path):
    path = write(tmp_path / "c.tsv", "".join(f"s{i} x\tt{i} y\n" for i in range(200)).encode())
    corpus = load_files(str(path), valid_percent=20, test_percent=20, window=2)
    assert not any(name.startswith("train_k") for name in corpus.splits)
    for name in ("valid", "test"):
        assert_window_sets(corpus.splits, name, 2)


@pytest.fixture(scope="module")
def multi30k_windows():
    if not MULTI30K.is_dir():
        pytest.skip(f"{MULTI30K} not present")
    return load_multi30k(str(MULTI30K), window=4, window_test=5)


def test_multi30k_windows_add_one_set_per_k_for_valid_and_every_test_set(multi30k_windows):
    corpus = multi30k_windows
    held_out = ["valid", "test", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"]
    assert corpus.window == 4 and corpus.chapters == {}
    assert set(corpus.splits) == {"train", *held_out} | {f"{s}_k{k}" for s in held_out for k in range(1, 6)}
    assert len(corpus.splits["train"]) == 29_000 and len(corpus.splits["test_2017_mscoco"]) == 461
    for name in held_out:
        assert_window_sets(corpus.splits, name, 5)


@needs_multi30k
def test_multi30k_single_captions_add_no_window_sets():
    corpus = load_multi30k(str(MULTI30K), window_test=1)
    assert corpus.window == 1 and not any("_k" in name for name in corpus.splits)
