"""SentencePiece subword tokenizers for the source and target side.

The models are trained on the training split only and kept as bytes, so a checkpoint can carry
them and nothing depends on a path. The special ids (PAD_ID, UNK_ID, BOS_ID, EOS_ID) are fixed for every
model this project trains; they live in nmt.special and are re-exported here.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import sentencepiece as spm

from nmt.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Tokenizer", "train_sentencepiece"]


def train_sentencepiece(
    sentences: Iterable[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    threads: int = 1,
) -> bytes:
    """Train a SentencePiece model on `sentences` and return the serialized model.

    `hard_vocab_limit=False` lets a small corpus (the synthetic task) ask for more pieces than
    it has without failing; one thread keeps the result identical from run to run.
    """
    if model_type not in ("unigram", "bpe", "char", "word"):
        raise ValueError(f"tokenizer.type must be unigram, bpe, char or word, not {model_type!r}")
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(sentences)),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        hard_vocab_limit=False,
        num_threads=threads,
        minloglevel=2,
    )
    return buffer.getvalue()


class Tokenizer:
    """A pair of SentencePiece models (the same model twice for a joint vocabulary)."""

    def __init__(self, src_model: bytes, tgt_model: bytes):
        self.src_model, self.tgt_model = src_model, tgt_model
        self.src = spm.SentencePieceProcessor(model_proto=src_model)
        self.tgt = spm.SentencePieceProcessor(model_proto=tgt_model)

    @property
    def joint(self) -> bool:
        return self.src_model == self.tgt_model

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Source ids followed by EOS."""
        return [ids + [EOS_ID] for ids in self.src.encode(texts)]

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        """Target ids followed by EOS (BOS is added by the batcher for the decoder input)."""
        return [ids + [EOS_ID] for ids in self.tgt.encode(texts)]

    def decode_tgt(self, ids: list[int]) -> str:
        """Detokenized text of target ids; stops at the first EOS and skips specials."""
        out = []
        for i in ids:
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                out.append(i)
        return self.tgt.decode(out)

    def src_pieces(self, text: str) -> list[str]:
        """The source pieces of `text` as the encoder sees them, EOS included (plot labels)."""
        return self.src.encode(text, out_type=str) + ["</s>"]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        """Target pieces of `ids` for plot labels."""
        return [self.tgt.id_to_piece(i) for i in ids]
