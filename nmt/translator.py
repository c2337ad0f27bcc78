"""Text in, translations out: tokenize, batch by length, search, detokenize, restore the input order.

    translator = Translator.from_checkpoint("outputs/.../checkpoints/best.pt", device="cpu", beam_size=5)
    [[best], ...] = translator.translate(["ein Satz .", "noch einer ."])
    best.text, best.score, best.src_pieces, best.tgt_pieces, best.attention   # attention (T+1, S)

Sentences are sorted by source length and cut into batches of at most `batch_tokens` padded source
tokens (by default 8,000 for greedy search and 4,000 for beam search: nmt.decoding.default_batch_tokens), so
the output never depends on the batch size or on which sentences share a batch. An empty (or whitespace-only)
input gives one empty Translation without running the model; a source longer than `max_src_pieces` pieces is
cut to that many (EOS kept) with a logged warning naming the line. The search's plan (nmt.plan, from
`kernels`: auto | eager) says which hand-written C++ kernels its steps run (nmt.kernels.compiled.kernels_for),
whatever the process's own choice (a Trainer's) is.
Shapes: B sentences in a batch, S source pieces (EOS included), T output pieces (EOS excluded).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from nmt.choices import Kernels
from nmt.decoding import Decoding, default_batch_tokens
from nmt.errors import ConfigError
from nmt.kernels.compiled import kernels_for
from nmt.model import Seq2Seq
from nmt.plan import plan_for_search
from nmt.precision import precision_choice
from nmt.search import search
from nmt.special import EOS_ID, PAD_ID
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class Translation:
    text: str  # detokenized output
    score: float  # log-probability divided by the length penalty (0.0 for an empty input)
    src_pieces: list[str]  # source pieces as the encoder saw them, "</s>" included ([] for an empty input)
    tgt_pieces: list[str]  # output pieces, "</s>" included when the output ended ([] for an empty input)
    attention: Tensor  # (len(tgt_pieces), len(src_pieces)) float32 on the CPU


class Translator:
    """A model and its tokenizer with fixed decoding settings (greedy when beam_size = nbest = 1)."""

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        device: str | torch.device = "cpu",
        beam_size: int = Decoding.beam_size,
        nbest: int = Decoding.nbest,
        length_penalty: float = Decoding.length_penalty,
        max_len_ratio: float = Decoding.max_len_ratio,
        max_len_extra: int = Decoding.max_len_extra,
        batch_tokens: int | None = Decoding.batch_tokens,
        amp: str = Decoding.amp,
        kernels: str = Decoding.kernels,
        max_src_pieces: int = 250,
    ):
        if beam_size < 1 or nbest < 1:
            raise ConfigError(f"beam size and nbest must be at least 1, not {beam_size} and {nbest}")
        if nbest > beam_size:
            raise ConfigError(f"nbest ({nbest}) cannot exceed the beam size ({beam_size}); raise the beam")
        if max_src_pieces < 2:
            raise ConfigError(f"max_src_pieces must be at least 2 (a piece and EOS), not {max_src_pieces}")
        if batch_tokens is None:
            batch_tokens = default_batch_tokens(beam_size)
        if batch_tokens < 1:
            raise ConfigError(f"batch_tokens must be at least 1 (padded source pieces per batch), not {batch_tokens}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.decoding = Decoding(
            beam_size, nbest, length_penalty, max_len_ratio, max_len_extra, batch_tokens, amp, kernels
        )
        # bf16 decoding: faster where the hardware has bf16, same BLEU (scripts/benchmark.py compares both)
        self.bf16, self.precision_reason = precision_choice(amp, self.device.type)
        log.info("decoding precision: %s (%s)", "bf16" if self.bf16 else "fp32", self.precision_reason)
        # the search's components and why (nmt.plan): the decoder step's C++ kernels where they pay
        self.plan = plan_for_search(self.model, self.device.type, self.bf16, self.precision_reason, kernels)
        self.kernels = Kernels.compiled if self.plan.kernels else Kernels.eager
        self.max_src_pieces = max_src_pieces
        self.checkpoint: str | None = None  # set by from_checkpoint; reported by nmt.evaluation

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu", **decoding) -> Translator:
        """Load a checkpoint written by nmt-train (CheckpointError if it cannot be used)."""
        from nmt.checkpoint import load_checkpoint

        return cls.from_payload(load_checkpoint(path), device, checkpoint=str(path), **decoding)

    @classmethod
    def from_payload(
        cls, payload: dict, device: str | torch.device = "cpu", checkpoint: str | None = None, **decoding
    ) -> Translator:
        """From an already loaded checkpoint (nmt-evaluate also needs the payload's stored config)."""
        from nmt.restore import model_from_checkpoint

        model, tokenizer = model_from_checkpoint(payload, device, path=checkpoint)
        translator = cls(model, tokenizer, device, **decoding)
        translator.checkpoint = checkpoint
        return translator

    @property
    def has_alignment(self) -> bool:
        """False for attention=none, whose weights are all zero."""
        return bool(self.model.attention.has_alignment)

    @property
    def has_self_attention(self) -> bool:
        """Whether the encoder has self-attention layers (model.self_attention_layers > 0)."""
        return bool(self.model.has_self_attention)

    def self_attention(self, text: str) -> Tensor | None:
        """The encoder's self-attention over `text`, encoded (and cut) as `translate` does: (layers, heads, S, S)
        float32 on the CPU, S = len(src_pieces) of its Translation; None without the layer or for an empty text."""
        if not self.has_self_attention:
            return None
        (seq,) = self._encode([text], 1, warn=False)  # translate() has warned about a cut
        if seq is None:
            return None
        src = torch.tensor([seq], dtype=torch.long, device=self.device)  # (1, S)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            layers = self.model.self_attention_weights(src, torch.tensor([len(seq)]))
        return torch.stack([w[0] for w in layers]).float().cpu()  # (layers, heads, S, S)

    @property
    def settings(self) -> dict:
        """The decoding settings as plain values (for reports)."""
        return {
            **asdict(self.decoding),
            "precision": "bf16" if self.bf16 else "fp32",
            "precision_reason": self.precision_reason,  # e.g. "amp=auto: AMX computes bf16 natively"
            "kernels_resolved": str(self.kernels),
            "plan": self.plan.record(),
            "max_src_pieces": self.max_src_pieces,
            "device": str(self.device),
            "attention": self.model.config.attention,
        }

    # ------------------------------------------------------------------------------------------ translate
    def fit_to(self, texts: list[str]) -> None:
        """Raise max_src_pieces to the longest of `texts` (pieces, EOS included), so that none of them is cut:
        for scoring a test set, where a cut input would lower the score for a reason that is not the model."""
        if texts:
            longest = max(len(ids) for ids in self.tokenizer.encode_src(texts))
            self.max_src_pieces = max(self.max_src_pieces, longest)

    def translate(
        self, texts: list[str], first_line: int = 1, progress: Callable[[int], object] | None = None
    ) -> list[list[Translation]]:
        """The `nbest` best translations of every text, in input order (one for an empty text).

        `first_line` is the line number of texts[0] in the caller's input, used in warnings; `progress`, where
        given, is told the number of texts each batch translated (e.g. a tqdm bar's update).
        """
        ids = self._encode(texts, first_line)
        results: list[list[Translation]] = [[] for _ in texts]
        for i, seq in enumerate(ids):
            if seq is None:
                results[i] = [Translation("", 0.0, [], [], torch.zeros(0, 0))]
        todo = sorted((i for i, seq in enumerate(ids) if seq is not None), key=lambda i: (len(ids[i]), i))
        if progress is not None and len(todo) < len(texts):
            progress(len(texts) - len(todo))  # the empty ones: done
        for batch in self._batches(todo, ids):
            for i, hyps in zip(batch, self._search([ids[i] for i in batch]), strict=True):
                results[i] = [self._translation(ids[i], h.tokens, h.score, h.attention) for h in hyps]
            if progress is not None:
                progress(len(batch))
        return results

    def _encode(self, texts: list[str], first_line: int, warn: bool = True) -> list[list[int] | None]:
        """Source ids (EOS included, cut to max_src_pieces) of every text; None for an empty one."""
        out: list[list[int] | None] = []
        # lone surrogates (from undecodable bytes) cannot reach sentencepiece: replace them with U+FFFD
        texts = [t.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for t in texts]
        nonempty = [t for t in texts if t.strip()]
        encoded = iter(self.tokenizer.encode_src(nonempty)) if nonempty else iter(())
        for n, text in enumerate(texts):
            if not text.strip():
                out.append(None)
                continue
            seq = next(encoded)
            limit = self.max_src_pieces
            if len(seq) > limit:
                if warn:
                    log.warning(
                        "line %d: %d source pieces, over max_src_pieces=%d; translating its first %d",
                        first_line + n,
                        len(seq),
                        limit,
                        limit - 1,
                    )
                seq = seq[: limit - 1] + [EOS_ID]
            out.append(seq)
        return out

    def _batches(self, order: list[int], ids: list) -> list[list[int]]:
        """Consecutive runs of `order` (sorted by length) with sentences x longest <= batch_tokens."""
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            if current and len(ids[i]) * (len(current) + 1) > self.decoding.batch_tokens:
                batches.append(current)
                current = []
            current.append(i)
        return batches + [current] if current else batches

    def _search(self, seqs: list[list[int]]) -> list:
        """Pad the id sequences into (B, S) and run the search; one list of Hypothesis per sentence."""
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)  # (B,) on the CPU
        src = torch.full((len(seqs), int(lengths.max())), PAD_ID, dtype=torch.long)  # (B, S)
        for b, s in enumerate(seqs):
            src[b, : len(s)] = torch.tensor(s, dtype=torch.long)
        d = self.decoding
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)
        with kernels_for(self.plan.kernels, self.plan.strict), autocast:
            return search(
                self.model,
                src.to(self.device),
                lengths,
                beam_size=d.beam_size,
                nbest=d.nbest,
                max_len_ratio=d.max_len_ratio,
                max_len_extra=d.max_len_extra,
                alpha=d.length_penalty,
            )

    def _translation(self, src_ids: list[int], tokens: list[int], score: float, attention: Tensor) -> Translation:
        src_pieces = [self.tokenizer.src.id_to_piece(i) for i in src_ids[:-1]] + ["</s>"]
        tgt_pieces = self.tokenizer.tgt_pieces(tokens)
        if attention.size(0) == len(tokens) + 1:  # the output ended with EOS (not cut at the length limit)
            tgt_pieces.append("</s>")
        return Translation(self.tokenizer.decode_tgt(tokens), score, src_pieces, tgt_pieces, attention.float().cpu())
