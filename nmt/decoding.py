"""The decoding settings: one dataclass, torch-free, so that command-line parsers can take its defaults.

It is the schema of the `decoding` config group (nmt-evaluate, configs/decoding/), the keyword arguments of
nmt.translator.Translator, and the source of nmt-translate's option defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.choices import Amp, Kernels


@dataclass
class Decoding:
    """The schema of the `decoding` config group (nmt-evaluate); Translator's keyword arguments."""

    beam_size: int = 1  # 1: greedy
    nbest: int = 1
    length_penalty: float = 1.0  # GNMT alpha: score / ((5 + length) / 6) ** alpha
    max_len_ratio: float = 1.5  # output at most ratio * source length + max_len_extra pieces
    max_len_extra: int = 10
    batch_tokens: int | None = None  # padded source pieces per decoding batch; None: default_batch_tokens(beam_size)
    amp: Amp = Amp.auto  # auto (bf16 autocast where the hardware has bf16) | bf16 | off
    # auto | eager: the search's C++ kernels as the run's plan chooses them (nmt.plan; the top-level `kernels`)
    kernels: Kernels = Kernels.auto


GREEDY_BATCH_TOKENS, BEAM_BATCH_TOKENS = 8000, 4000


def default_batch_tokens(beam_size: int) -> int:
    """decoding.batch_tokens where it is not set: 8,000 padded source pieces for greedy search, 4,000 for beam
    search, whose batch holds beam_size rows per sentence. A batch's memory follows its rows, so greedy at 8,000
    holds less than beam 5 at 4,000, and greedy was the fastest at 8,000 on every CPU measured (docs/performance.md,
    "Decoding batches"); beam 5 moved by at most 8% between 2,000 and 8,000, 4,000 never the slowest."""
    return GREEDY_BATCH_TOKENS if beam_size == 1 else BEAM_BATCH_TOKENS
