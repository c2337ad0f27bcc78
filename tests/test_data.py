"""Tokenizer round trips, the token batch sampler's properties, the cache and the length filter."""

from __future__ import annotations

import random

import pytest
import torch

from nmt.choices import Bucketing
from nmt.corpora import Corpus, load_synthetic
from nmt.corpora.windows import add_window_splits
from nmt.data import EncodedSplit, TokenizerSettings, collate, prepare
from nmt.sampler import TokenBatchSampler, padding_overhead
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_sentencepiece

SENTENCES = [
    "Im Anfang schuf Gott die Himmel und die Erde.",
    "In the beginning God created the heaven and the earth.",
    "Und Gott sprach: Es werde Licht! und es ward Licht.",
    "And God said, Let there be light: and there was light.",
] * 50


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    model = train_sentencepiece(SENTENCES, vocab_size=120)
    return Tokenizer(model, model)


def test_special_ids_are_fixed(tokenizer):
    sp = tokenizer.src
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, 1, BOS_ID, EOS_ID)


@pytest.mark.parametrize("text", SENTENCES[:4] + ["Licht und Erde", "  spaced   out  "])
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode_tgt([text])[0]
    assert ids[-1] == EOS_ID
    assert tokenizer.decode_tgt(ids) == " ".join(text.split())


def test_decode_stops_at_eos_and_skips_specials(tokenizer):
    ids = tokenizer.encode_tgt(["Gott sprach"])[0]
    assert tokenizer.decode_tgt([BOS_ID] + ids + [5, 6, 7]) == "Gott sprach"


def test_bpe_and_separate_vocabularies():
    src = train_sentencepiece(SENTENCES[0::2], vocab_size=80, model_type="bpe")
    tgt = train_sentencepiece(SENTENCES[1::2], vocab_size=80, model_type="bpe")
    tok = Tokenizer(src, tgt)
    assert not tok.joint
    assert tok.decode_tgt(tok.encode_tgt([SENTENCES[1]])[0]) == SENTENCES[1]


def _lengths(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = random.Random(seed)
    return (torch.tensor([rng.randint(1, 60) for _ in range(n)]), torch.tensor([rng.randint(1, 60) for _ in range(n)]))


BUCKETINGS = pytest.mark.parametrize("bucketing", list(Bucketing))


@BUCKETINGS
def test_sampler_covers_every_example_once_and_respects_the_cap(bucketing):
    src, tgt = _lengths(2000)
    sampler = TokenBatchSampler(src, tgt, batch_tokens=800, seed=3, bucketing=bucketing)
    for epoch in range(3):
        batches = sampler.batches(epoch)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(2000))
        longest = torch.maximum(src, tgt)
        for b in batches:
            assert len(b) == 1 or len(b) * int(longest[b].max()) <= 800


@BUCKETINGS
def test_sampler_same_seed_same_order_and_epochs_differ(bucketing):
    src, tgt = _lengths(500)
    a = TokenBatchSampler(src, tgt, 400, seed=7, bucketing=bucketing)
    b = TokenBatchSampler(src, tgt, 400, seed=7, bucketing=bucketing)
    assert a.batches(0) == b.batches(0)
    assert a.batches(0) != a.batches(1)
    assert a.batches(0) != TokenBatchSampler(src, tgt, 400, seed=8, bucketing=bucketing).batches(0)


@BUCKETINGS
def test_sampler_groups_similar_lengths(bucketing):
    src, tgt = _lengths(3000)
    batches = TokenBatchSampler(src, tgt, 1000, seed=1, bucketing=bucketing).batches(0)
    split = EncodedSplit([[5] * int(n) for n in src], [[5] * int(n) for n in tgt])
    real, padded = padding_overhead(split, batches)
    random_batches = [list(range(i, min(i + 30, 3000))) for i in range(0, 3000, 30)]
    real_r, padded_r = padding_overhead(split, random_batches)
    assert padded / real < 0.8 * (padded_r / real_r)


@BUCKETINGS
@pytest.mark.parametrize("world", [2, 3])
def test_sampler_shards_are_disjoint_and_complete(world, bucketing):
    src, tgt = _lengths(1000)
    shards = [
        TokenBatchSampler(src, tgt, 600, seed=5, rank=r, world_size=world, bucketing=bucketing) for r in range(world)
    ]
    per_rank = [s.batches(2) for s in shards]
    assert len({len(p) for p in per_rank}) == 1  # every rank takes the same number of steps
    seen = [i for p in per_rank for b in p for i in b]
    assert sorted(seen) == list(range(1000))  # disjoint and complete
    assert all(len(b) > 0 for p in per_rank for b in p)


@BUCKETINGS
@pytest.mark.parametrize("world", [1, 2])
def test_sampler_batches_come_longest_target_first(world, bucketing):
    """The decoder loop leaves a sentence when its target ends (nmt.decoder.active_rows): on every rank, each
    batch holds its sentences longest target first."""
    src, tgt = _lengths(1000)
    for rank in range(world):
        sampler = TokenBatchSampler(src, tgt, 600, seed=5, rank=rank, world_size=world, bucketing=bucketing)
        for b in sampler.batches(1):
            assert tgt[b].tolist() == sorted(tgt[b].tolist(), reverse=True)


def test_exact_bucketing_gives_full_batches_one_source_length_and_merges_small_ends():
    """A batch is at least half full or holds one source length; small ends of a length's group merge with
    the next length (neighbouring lengths, so little padding), and most batches still have one length."""
    src, tgt = _lengths(3000, seed=4)
    sampler = TokenBatchSampler(src, tgt, 700, seed=2, bucketing="exact")
    longest = torch.maximum(src, tgt)
    for epoch in range(2):
        batches = sampler.batches(epoch)
        one_length = [b for b in batches if len(set(src[b].tolist())) == 1]
        assert len(one_length) >= 0.75 * len(batches)
        for b in batches:
            if len(set(src[b].tolist())) > 1:  # merged: neighbouring lengths, and not left tiny
                lengths = sorted(set(src[b].tolist()))
                assert lengths[-1] - lengths[0] <= 3, lengths
        small = [b for b in batches if len(b) * int(longest[b].max()) < 700 * TokenBatchSampler.MERGE_BELOW]
        assert len(small) <= 1  # only the epoch's very last batch may be small
        sorted_batches = TokenBatchSampler(src, tgt, 700, seed=2, bucketing="sorted").batches(epoch)
        assert len(batches) <= 1.25 * len(sorted_batches)  # random target lengths here; the Bible: 1.10
    with pytest.raises(ValueError, match="bucketing"):
        TokenBatchSampler(src, tgt, 700, seed=2, bucketing="random")


def test_collate_shifts_target_and_pads():
    split = EncodedSplit([[7, 8, EOS_ID], [9, EOS_ID]], [[10, 11, EOS_ID], [12, EOS_ID]])
    batch = collate(split, [0, 1])
    assert batch.src.tolist() == [[7, 8, EOS_ID], [9, EOS_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 10, 11], [BOS_ID, 12, PAD_ID]]
    assert batch.tgt_out.tolist() == [[10, 11, EOS_ID], [12, EOS_ID, PAD_ID]]
    assert batch.n_tokens == 5 and batch.src_lengths.tolist() == [3, 2] and batch.tgt_lengths.tolist() == [3, 2]


def test_collate_pads_as_one_sentence_at_a_time_would():
    """collate's tensor operations give what padding each sentence in turn gives, for any lengths and order."""
    g = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(4, 50, (n,), generator=g).tolist() + [EOS_ID]

    lengths = torch.randint(0, 30, (300, 2), generator=g).tolist()
    split = EncodedSplit([ids(s) for s, _ in lengths], [ids(t) for _, t in lengths])
    for size in (1, 2, 17, 300):
        indices = torch.randperm(300, generator=g)[:size].tolist()
        batch = collate(split, indices)
        srcs, tgts = [split.source(i) for i in indices], [split.target(i) for i in indices]
        S, T = max(map(len, srcs)), max(map(len, tgts))
        src, tgt_in, tgt_out = (torch.full((size, n), PAD_ID) for n in (S, T, T))
        for b, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
            src[b, : len(s)], tgt_out[b, : len(t)], tgt_in[b, : len(t)] = (
                s,
                t,
                torch.cat([torch.tensor([BOS_ID]), t[:-1]]),
            )
        assert torch.equal(batch.src, src) and torch.equal(batch.tgt_in, tgt_in) and torch.equal(batch.tgt_out, tgt_out)
        assert batch.src.dtype == batch.tgt_in.dtype == torch.long and batch.indices.tolist() == indices
        assert batch.src_lengths.tolist() == list(map(len, srcs)) and batch.tgt_lengths.tolist() == list(map(len, tgts))
        assert batch.n_tokens == sum(map(len, tgts))


def _small_corpus(seed: int = 1) -> Corpus:
    return load_synthetic(seed=seed, train_size=400, valid_size=20, test_size=20, max_len=8, test_max_len=12)


def test_prepare_caches_and_reuses(tmp_path):
    settings = TokenizerSettings(vocab_size=80)
    first = prepare(_small_corpus(), settings, 100, tmp_path, progress=False)
    stamp = (first.cache_dir / "encoded.pt").stat().st_mtime_ns
    again = prepare(_small_corpus(), settings, 100, tmp_path, progress=False)
    assert again.cache_dir == first.cache_dir
    assert (again.cache_dir / "encoded.pt").stat().st_mtime_ns == stamp
    assert torch.equal(again.encoded["train"].src, first.encoded["train"].src)
    assert again.tokenizer.src_model == first.tokenizer.src_model


def test_cache_key_changes_with_corpus_and_settings(tmp_path):
    base = prepare(_small_corpus(), TokenizerSettings(vocab_size=80), 100, tmp_path, progress=False)
    other_data = prepare(_small_corpus(seed=2), TokenizerSettings(vocab_size=80), 100, tmp_path, progress=False)
    other_vocab = prepare(_small_corpus(), TokenizerSettings(vocab_size=60), 100, tmp_path, progress=False)
    assert len({base.cache_dir, other_data.cache_dir, other_vocab.cache_dir}) == 3


def test_length_filter_applies_to_train_only(tmp_path):
    corpus = _small_corpus()
    data = prepare(corpus, TokenizerSettings(vocab_size=80), 6, tmp_path, progress=False)
    assert len(data.encoded["train"]) < len(corpus.splits["train"])
    assert int(data.encoded["train"].src_lengths.max()) <= 6
    assert len(data.encoded["valid"]) == len(corpus.splits["valid"])
    dropped = next(v for k, v in data.dropped.items() if k.startswith("longer than"))
    assert dropped == len(corpus.splits["train"]) - len(data.encoded["train"])
    # the kept indices map encoded rows back to their text
    s, t = data.pairs("train")[0]
    assert data.tokenizer.decode_tgt(data.encoded["train"].target(0).tolist()) == t


# --------------------------------------------------------------------------------------------- verse windows
@pytest.fixture(scope="module")
def windowed(tmp_path_factory, dress_as_chapters):
    """A synthetic corpus dressed as chapters of 1-9 verses, with windows of up to 3 verses."""
    corpus = load_synthetic(
        seed=4,
        train_size=400,
        valid_size=20,
        test_size=20,
        min_len=2,
        max_len=6,
        test_min_len=2,
        test_max_len=6,
        vocab_words=30,
    )
    corpus = dress_as_chapters(corpus, window=3, seed=0, shortest=1, longest=9)
    return prepare(corpus, TokenizerSettings(vocab_size=70), 100, tmp_path_factory.mktemp("windows"), progress=False)


def test_windows_cover_every_verse_once_per_epoch_within_chapters(windowed):
    chapters = windowed.corpus.chapters["train"]
    verses = windowed.encoded["train"]
    texts = windowed.pairs("train")
    splits = [windowed.train_split(epoch, seed=5) for epoch in (0, 1)]
    for split in splits:
        joined = [windowed.tokenizer.src.decode(split.source(i).tolist()[:-1]) for i in range(len(split))]
        assert " ".join(joined).split() == " ".join(s for s, _ in texts).split()  # every verse once, in order
        assert len(verses) / 3 <= len(split) < len(verses)
        # a window's pieces are those of its verses' text joined with a space, with one EOS at the end
        start = 0
        for i in range(len(split)):
            n = next(n for n in range(1, 4) if " ".join(s for s, _ in texts[start : start + n]) == joined[i])
            assert len(set(chapters[start : start + n])) == 1  # one chapter
            text = [" ".join(s for s, _ in texts[start : start + n]), " ".join(t for _, t in texts[start : start + n])]
            assert split.source(i).tolist() == windowed.tokenizer.encode_src([text[0]])[0]
            assert split.target(i).tolist() == windowed.tokenizer.encode_tgt([text[1]])[0]
            start += n
    assert splits[0].src.tolist() != splits[1].src.tolist() or len(splits[0]) != len(splits[1])  # drawn anew
    assert windowed.train_split(1, seed=5).src.tolist() == splits[1].src.tolist()  # the same seed: the same


def test_without_windows_every_epoch_trains_on_the_encoded_pairs(tmp_path):
    corpus = load_synthetic(seed=4, train_size=50, valid_size=5, test_size=5, vocab_words=10)
    data = prepare(corpus, TokenizerSettings(vocab_size=40), 100, tmp_path, progress=False)
    assert data.train_split(0, 1) is data.train_split(3, 1) is data.encoded["train"]


# --------------------------------------------------------------------------------------------- caption windows
@pytest.fixture(scope="module")
def caption_windows(tmp_path_factory):
    """A synthetic corpus without chapters (as captions or the user's files), with windows of up to 3 pairs
    and the k-sets of valid and test. Each training source ends in its index, so a window names its pairs."""
    corpus = load_synthetic(
        seed=4,
        train_size=300,
        valid_size=20,
        test_size=20,
        min_len=2,
        max_len=6,
        test_min_len=2,
        test_max_len=6,
        vocab_words=30,
    )
    corpus.splits["train"] = [(f"{s} {i}", t) for i, (s, t) in enumerate(corpus.splits["train"])]
    corpus.splits = add_window_splits(corpus.splits, {}, 3)
    corpus.window = 3
    assert corpus.chapters == {}
    return prepare(corpus, TokenizerSettings(vocab_size=70), 100, tmp_path_factory.mktemp("captions"), progress=False)


def _window_pairs(data, split: EncodedSplit) -> list[list[int]]:
    """The training pairs (indices into data.pairs("train")) in each window of `split`, read off the index
    that ends every training source."""
    out = []
    for i in range(len(split)):
        text = data.tokenizer.src.decode(split.source(i).tolist()[:-1])
        out.append([int(w) for w in text.split() if w.isdigit()])
    return out


def test_caption_windows_cover_every_pair_once_per_epoch_in_a_fresh_shuffle(caption_windows):
    data = caption_windows
    texts = data.pairs("train")
    n = len(texts)
    assert len(data.encoded["train"]) == n == 300
    orders = []
    for epoch in range(3):
        split = data.train_split(epoch, seed=5)
        groups = _window_pairs(data, split)
        order = [i for g in groups for i in g]
        assert sorted(order) == list(range(n))  # every training pair exactly once
        assert all(1 <= len(g) <= 3 for g in groups)
        assert {len(g) for g in groups} == {1, 2, 3}  # sizes are drawn from 1..K
        assert n / 3 <= len(split) < n
        assert order != sorted(order)  # consecutive in a shuffle, not in file order
        for i, g in enumerate(groups):  # a window's ids are those of its pairs' text joined with a space
            src, tgt = " ".join(texts[j][0] for j in g), " ".join(texts[j][1] for j in g)
            assert split.source(i).tolist() == data.tokenizer.encode_src([src])[0]
            assert split.target(i).tolist() == data.tokenizer.encode_tgt([tgt])[0]
        orders.append((order, [len(g) for g in groups]))
    assert orders[0] != orders[1] != orders[2] != orders[0]  # drawn anew each epoch


def test_caption_windows_are_the_same_for_the_same_epoch_and_seed(caption_windows):
    data = caption_windows
    a, b = data.train_split(2, seed=7), data.train_split(2, seed=7)
    assert a is not b and a.src.tolist() == b.src.tolist() and a.tgt.tolist() == b.tgt.tolist()
    assert a.src_lengths.tolist() == b.src_lengths.tolist()
    assert _window_pairs(data, a) != _window_pairs(data, data.train_split(2, seed=8))
    assert data.encoded["train"] is not a and len(data.encoded["train"]) == 300  # the encoded pairs stay as they were


def test_over_length_counts_evaluation_pairs_and_never_train(caption_windows):
    data = caption_windows
    held_out = [split for split in data.encoded if split != "train"]
    assert len(held_out) == 8  # valid, test and their k-sets
    longest_train = int(torch.maximum(data.encoded["train"].src_lengths, data.encoded["train"].tgt_lengths).max())
    for max_length in (0, 3, 5, 8, 12, longest_train - 1):
        expected = {}
        for split in held_out:
            pairs = data.corpus.splits[split]
            src, tgt = (
                data.tokenizer.encode_src([s for s, _ in pairs]),
                data.tokenizer.encode_tgt([t for _, t in pairs]),
            )
            expected[split] = sum(len(s) > max_length or len(t) > max_length for s, t in zip(src, tgt, strict=True))
        counts = data.over_length(max_length)
        assert "train" not in counts  # train has longer pairs at every one of these lengths
        assert set(counts) <= set(held_out)
        assert {k: v for k, v in expected.items() if v} == {k: v for k, v in counts.items() if v}, max_length
    assert data.over_length(0) == {split: len(data.corpus.splits[split]) for split in held_out}  # EOS counts
    assert not any(data.over_length(10_000).values())
    # a window is longer than each of its pairs: at the longest single test pair, only windows are over
    single = data.encoded["test_k1"]
    longest_test = int(torch.maximum(single.src_lengths, single.tgt_lengths).max())
    counts = data.over_length(longest_test)
    assert counts.get("test_k1", 0) == counts.get("test", 0) == 0 and counts["test_k3"] > 0
