"""The tokenizer: its round trip is exactly NFKC + whitespace collapsing for text it knows."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.tokenizer import Tokenizer, train_sentencepiece

ROUND_TRIP_CORPUS = [
    "Im Anfang schuf Gott Himmel und Erde. Größe, Übermaß, Äpfel!",
    "Le garçon a mangé une crème brûlée à l'hôtel ; où est-il ?",
    "Στην αρχή ήταν ο Λόγος",
    "В начале было Слово, и Слово было у Бога",
    "בְּרֵאשִׁית בָּרָא",
    "في البدء كان الكلمة",
    "太初有道，道与神同在。",
    "はじめに言葉があった",
    "emoji \U0001f600 \U0001f389 \U0001f44d ok",
    'The quick brown fox jumps over the lazy dog 0123456789 (x) [y] {z} "q" #1 $2 %3 &4 *5 +6 -7 /8 :9',
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz <>=?@",
] * 20


def nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


@pytest.fixture(scope="module")
def round_trip():
    """A tokenizer and the text it knows: its alphabet K, compatibility forms C, decomposed forms D, spaces W.

    K: every non-space character of the training text that NFKC leaves alone (all of them become pieces,
    character_coverage=1.0). C: single characters whose NFKC form is made of K characters (fullwidth letters,
    ligatures, ...), except U+FF5E FULLWIDTH TILDE, which SentencePiece's nmt_nfkc rule maps differently from
    NFKC. D: the NFD forms of K's precomposed letters (e + U+0301 ...). W: whitespace that both Python's
    str.split and SentencePiece treat as a separator (controls such as U+000B and U+001C it deletes instead).
    """
    model = train_sentencepiece(ROUND_TRIP_CORPUS, vocab_size=200)
    known = sorted({c for s in ROUND_TRIP_CORPUS for c in s if not c.isspace() and nfkc(c) == c})
    k = set(known)
    compat = [
        chr(i)
        for i in range(0xA0, 0x30000)
        if chr(i) != "\uff5e"
        and not 0xD800 <= i < 0xE000
        and nfkc(chr(i)) != chr(i)
        and nfkc(chr(i)).strip()
        and set(nfkc(chr(i))) <= k
    ]
    decomposed = sorted({unicodedata.normalize("NFD", c) for c in known} - k)
    assert len(compat) > 100 and len(decomposed) > 10
    atoms = st.one_of(
        st.sampled_from(known),
        st.sampled_from(compat),
        st.sampled_from(decomposed),
        st.sampled_from(list(" \t\n\r\u00a0\u2003\u3000")),
    )
    return Tokenizer(model, model), st.lists(atoms, max_size=30).map("".join)


def test_round_trip_is_nfkc_with_whitespace_collapsed(round_trip):
    """decode(encode(x)) == " ".join(NFKC(x).split()) for every x made of K, C, D and W (see the fixture)."""
    tokenizer, texts = round_trip

    @settings(max_examples=50, deadline=None)
    @given(x=texts)
    def check(x):
        assert tokenizer.decode_tgt(tokenizer.encode_tgt([x])[0]) == " ".join(nfkc(x).split())

    check()
