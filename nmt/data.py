"""From sentence pairs to padded batches: encoding, caching, length filtering and collating (which sentences
train together is nmt.sampler).

    corpus pairs -> sentencepiece (trained on train, cached) -> id tensors (cached) -> batches

The cache lives under `<data_dir>/cache/<corpus>-<key>/`, where the key hashes every sentence of
the corpus and every tokenizer setting: editing a file or a setting makes a new cache entry.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import random
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from nmt import cache
from nmt.choices import TokenizerType
from nmt.corpora import Corpus, Pair
from nmt.special import BOS_ID, EOS_ID, PAD_ID
from nmt.tokenizer import Tokenizer, train_sentencepiece

log = logging.getLogger(__name__)
CACHE_VERSION = 1
DEFAULT_MAX_LENGTH = 100  # data.max_length: training pairs with more pieces on either side are dropped


@dataclass
class TokenizerSettings:
    """SentencePiece, trained on the training split only (cached under `paths.data_dir`/cache)."""

    type: TokenizerType = TokenizerType.unigram
    vocab_size: int = 8000
    joint: bool = True  # one vocabulary for source and target
    character_coverage: float = 1.0


class EncodedSplit:
    """Id sequences of one split stored as two flat int32 tensors plus offsets.

    Indexing returns views (no copy). `src_lengths`/`tgt_lengths` include EOS.
    """

    def __init__(self, src: list[list[int]], tgt: list[list[int]]):
        assert len(src) == len(tgt)
        self.src_lengths = torch.tensor([len(s) for s in src], dtype=torch.long)
        self.tgt_lengths = torch.tensor([len(t) for t in tgt], dtype=torch.long)
        self.src = torch.tensor([i for s in src for i in s], dtype=torch.int32)
        self.tgt = torch.tensor([i for t in tgt for i in t], dtype=torch.int32)
        self._src_start = torch.cumsum(self.src_lengths, 0) - self.src_lengths
        self._tgt_start = torch.cumsum(self.tgt_lengths, 0) - self.tgt_lengths

    def __len__(self) -> int:
        return len(self.src_lengths)

    def source(self, i: int) -> torch.Tensor:
        s = int(self._src_start[i])
        return self.src[s : s + int(self.src_lengths[i])]

    def target(self, i: int) -> torch.Tensor:
        s = int(self._tgt_start[i])
        return self.tgt[s : s + int(self.tgt_lengths[i])]

    def state_dict(self) -> dict:
        return {"src": self.src, "tgt": self.tgt, "src_lengths": self.src_lengths, "tgt_lengths": self.tgt_lengths}

    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of the ids and lengths: equal for equal encoded splits, whatever their source."""
        h = hashlib.sha256()
        for t in (self.src_lengths, self.tgt_lengths, self.src, self.tgt):
            h.update(t.contiguous().numpy())
        return h.hexdigest()[:16]

    @classmethod
    def from_state_dict(cls, d: dict) -> EncodedSplit:
        self = cls.__new__(cls)
        self.src, self.tgt = d["src"], d["tgt"]
        self.src_lengths, self.tgt_lengths = d["src_lengths"], d["tgt_lengths"]
        self._src_start = torch.cumsum(self.src_lengths, 0) - self.src_lengths
        self._tgt_start = torch.cumsum(self.tgt_lengths, 0) - self.tgt_lengths
        return self


@dataclass
class PreparedData:
    """Everything training needs: text pairs, tokenizer, encoded splits and what was dropped."""

    corpus: Corpus
    tokenizer: Tokenizer
    encoded: dict[str, EncodedSplit]
    kept: dict[str, list[int]]  # split -> indices into corpus.splits[split] that were encoded
    dropped: dict[str, int]
    cache_dir: Path
    max_length: int = DEFAULT_MAX_LENGTH  # the training pairs' limit they were filtered with

    def pairs(self, split: str) -> list[Pair]:
        """The text pairs of `split` in the order of `encoded[split]`."""
        return [self.corpus.splits[split][i] for i in self.kept[split]]

    def over_length(self, max_length: int) -> dict[str, int]:
        """Evaluation split -> how many of its pairs have more than `max_length` pieces on either side (EOS
        included, as training counts them): kept, since evaluation never drops a pair, but worth saying, e.g.
        for the long windows of the bottleneck study."""
        out = {}
        for split, enc in self.encoded.items():
            if split != "train":
                n = int(((enc.src_lengths > max_length) | (enc.tgt_lengths > max_length)).sum())
                if n:
                    out[split] = n
        return out

    def fingerprints(self) -> dict[str, object]:
        """What training reads, for a checkpoint to compare on resume (nmt.resume): a fingerprint of each encoded
        split (`corpus.<split>`), the windowing (`corpus.window`, and `corpus.train_chapters`: the chapters the
        windows keep within, when there are windows and chapters) and both tokenizer models (`tokenizer.*`)."""
        out: dict[str, object] = {f"corpus.{name}": split.fingerprint() for name, split in sorted(self.encoded.items())}
        out["corpus.window"] = self.corpus.window
        chapters = self.corpus.chapters.get("train") if self.corpus.window > 1 else None
        kept = [chapters[i] for i in self.kept["train"]] if chapters else None
        out["corpus.train_chapters"] = _sha16(json.dumps(kept)) if kept else None
        return {**out, **tokenizer_fingerprints(self.tokenizer.src_model, self.tokenizer.tgt_model)}

    def with_tokenizer(self, tokenizer: Tokenizer) -> PreparedData:
        """The same corpus encoded with `tokenizer` (not cached): a resumed run keeps its checkpoint's tokenizer
        rather than one trained again on disk (nmt.trainer.Trainer.restore)."""
        encoded, kept, dropped = encode_splits(self.corpus, tokenizer, self.max_length)
        return PreparedData(self.corpus, tokenizer, encoded, kept, dropped, self.cache_dir, self.max_length)

    def train_split(self, epoch: int, seed: int) -> EncodedSplit:
        """What epoch `epoch` trains on: the encoded training pairs, or (data.window = K > 1) windows of 1..K
        pairs drawn anew for each epoch (the same for the same seed): consecutive verses of one chapter (Bible),
        else consecutive pairs of a fresh shuffle of the training split (captions, the user's files)."""
        if self.corpus.window <= 1:
            return self.encoded["train"]
        rng = random.Random(seed * 1_000_003 + epoch)
        if "train" in self.corpus.chapters:
            chapters = [self.corpus.chapters["train"][i] for i in self.kept["train"]]
            runs = [list(run) for _, run in itertools.groupby(range(len(chapters)), key=chapters.__getitem__)]
        else:
            order = list(range(len(self.encoded["train"])))
            rng.shuffle(order)
            runs = [order]
        return window_split(self.encoded["train"], runs, self.corpus.window, rng)


def window_split(split: EncodedSplit, runs: list[list[int]], max_pairs: int, rng: random.Random) -> EncodedSplit:
    """The examples of each run (a list of indices into `split`, in order) joined into windows of consecutive
    examples, 1..max_pairs long (sizes drawn uniformly by `rng`); every example lands in exactly one window.
    Ids are joined as the text would be: a window's sources are its pairs' pieces with one EOS at the end
    (SentencePiece cuts at spaces, so the pieces of "a b" are those of "a" followed by those of "b")."""
    src, tgt = [], []
    for idx in runs:
        start = 0
        while start < len(idx):
            window = idx[start : start + rng.randint(1, max_pairs)]
            src.append([t for i in window for t in split.source(i)[:-1].tolist()] + [EOS_ID])
            tgt.append([t for i in window for t in split.target(i)[:-1].tolist()] + [EOS_ID])
            start += len(window)
    return EncodedSplit(src, tgt)


def _sha16(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:16]


def tokenizer_fingerprints(src_model: bytes, tgt_model: bytes) -> dict[str, str]:
    """sha256 (16 hex digits) of both serialized SentencePiece models."""
    return {"tokenizer.src_model": _sha16(src_model), "tokenizer.tgt_model": _sha16(tgt_model)}


def corpus_key(corpus: Corpus, settings: TokenizerSettings, max_length: int) -> str:
    """A hash of every sentence and every setting that shapes the cache."""
    h = hashlib.sha256()
    h.update(json.dumps([CACHE_VERSION, corpus.name, settings.__dict__, max_length]).encode())
    for split in sorted(corpus.splits):
        h.update(split.encode())
        for s, t in corpus.splits[split]:
            h.update(s.encode())
            h.update(b"\t")
            h.update(t.encode())
            h.update(b"\n")
    return h.hexdigest()[:16]


def prepare(
    corpus: Corpus, settings: TokenizerSettings, max_length: int, data_dir: str | Path, progress: bool = True
) -> PreparedData:
    """Train (or reuse) the tokenizer, encode every split (or reuse the cache) and filter long pairs.

    Training pairs with more than `max_length` pieces on either side are dropped (and counted);
    validation and test pairs are always kept, since they are what we measure on.
    """
    cache_dir = Path(data_dir) / "cache" / f"{corpus.name}-{corpus_key(corpus, settings, max_length)}"
    found = cache.read(cache_dir)  # None where missing, or damaged (said in one line): prepared again
    if found is not None:
        log.info("reusing cache %s", cache_dir)
        src_model, tgt_model, blob = found
        encoded = {k: EncodedSplit.from_state_dict(v) for k, v in blob["encoded"].items()}
        tokenizer = Tokenizer(src_model, tgt_model)
        return PreparedData(corpus, tokenizer, encoded, blob["kept"], blob["dropped"], cache_dir, max_length)

    cache_dir.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=1 + len(corpus.splits), desc="prepare", unit="stage", disable=not progress)
    bar.set_postfix_str("training sentencepiece")
    tokenizer = train_tokenizer(corpus.splits["train"], settings)
    bar.update()
    encoded, kept, dropped = encode_splits(corpus, tokenizer, max_length, bar)
    bar.close()
    blob = {"encoded": {k: v.state_dict() for k, v in encoded.items()}, "kept": kept, "dropped": dropped}
    cache.write(cache_dir, tokenizer.src_model, tokenizer.tgt_model, blob)
    return PreparedData(corpus, tokenizer, encoded, kept, dropped, cache_dir, max_length)


def encode_splits(
    corpus: Corpus, tokenizer: Tokenizer, max_length: int, bar: tqdm | None = None
) -> tuple[dict[str, EncodedSplit], dict[str, list[int]], dict[str, int]]:
    """(encoded splits, kept indices, dropped counts) of every split of `corpus` encoded with `tokenizer`;
    training pairs with more than `max_length` pieces on either side are dropped."""
    encoded, kept = {}, {}
    dropped = dict(corpus.dropped)
    for split, pairs in corpus.splits.items():
        if bar is not None:
            bar.set_postfix_str(f"encoding {split}")
        src = tokenizer.encode_src([s for s, _ in pairs])
        tgt = tokenizer.encode_tgt([t for _, t in pairs])
        keep = list(range(len(pairs)))
        if split == "train":
            keep = [i for i in keep if len(src[i]) <= max_length and len(tgt[i]) <= max_length]
            dropped[f"longer than {max_length} pieces (train only)"] = len(pairs) - len(keep)
        encoded[split] = EncodedSplit([src[i] for i in keep], [tgt[i] for i in keep])
        kept[split] = keep
        if bar is not None:
            bar.update()
    return encoded, kept, dropped


def train_tokenizer(train_pairs: list[Pair], settings: TokenizerSettings) -> Tokenizer:
    """Train joint or separate SentencePiece models on the training pairs only."""
    src = [s for s, _ in train_pairs]
    tgt = [t for _, t in train_pairs]
    args = (settings.vocab_size, settings.type, settings.character_coverage)
    if settings.joint:
        model = train_sentencepiece(src + tgt, *args)
        return Tokenizer(model, model)
    return Tokenizer(train_sentencepiece(src, *args), train_sentencepiece(tgt, *args))


# --------------------------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """A padded batch. Shapes: B sentences, S source length, T target length (with BOS/EOS shifts)."""

    src: torch.Tensor  # (B, S) long, PAD_ID after each sentence's EOS
    src_lengths: torch.Tensor  # (B,) long, on the CPU (pack_padded_sequence wants it there)
    tgt_in: torch.Tensor  # (B, T) BOS + target
    tgt_out: torch.Tensor  # (B, T) target + EOS
    indices: torch.Tensor  # (B,) positions in the split
    n_tokens: int  # real target tokens (EOS included): the loss is normalised by this
    tgt_lengths: torch.Tensor  # (B,) long, on the CPU: real target tokens per sentence (EOS included)

    def pin_memory(self) -> Batch:
        """The batch in page-locked memory, so `.to(cuda, non_blocking=True)` copies asynchronously."""
        return replace(
            self, src=self.src.pin_memory(), tgt_in=self.tgt_in.pin_memory(), tgt_out=self.tgt_out.pin_memory()
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The id tensors on `device`; the lengths and indices stay on the host, where they are read."""
        src, tgt_in, tgt_out = (t.to(device, non_blocking=non_blocking) for t in (self.src, self.tgt_in, self.tgt_out))
        return replace(self, src=src, tgt_in=tgt_in, tgt_out=tgt_out)


def collate(split: EncodedSplit, indices: list[int]) -> Batch:
    """Pad the sentences `indices` of `split` into a Batch: a few tensor operations whatever the batch size
    (a Python loop over 500 sentences took ~20 ms; this runs between training steps)."""
    idx = torch.tensor(indices, dtype=torch.long)
    src_lengths, tgt_lengths = split.src_lengths[idx], split.tgt_lengths[idx]  # (B,)
    src = _padded(split.src, split._src_start[idx], src_lengths)  # (B, S)
    tgt_out = _padded(split.tgt, split._tgt_start[idx], tgt_lengths)  # (B, T) target + EOS
    tgt_in = torch.cat([torch.full_like(tgt_out[:, :1], BOS_ID), tgt_out[:, :-1]], dim=1)  # (B, T) BOS + target
    tgt_in.masked_fill_(torch.arange(tgt_in.size(1)) >= tgt_lengths[:, None], PAD_ID)  # not the EOS shifted in
    return Batch(src, src_lengths, tgt_in, tgt_out, idx, int(tgt_lengths.sum()), tgt_lengths)


def _padded(flat: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The sequences flat[starts[b] : starts[b] + lengths[b]] as rows of a (B, max length) long tensor, PAD_ID
    after each."""
    positions = torch.arange(int(lengths.max()))  # (L,)
    real = positions < lengths[:, None]  # (B, L)
    ids = flat[(starts[:, None] + positions).clamp_(max=flat.numel() - 1)].long()  # (B, L), past the ends clamped
    return ids.masked_fill_(~real, PAD_ID)
