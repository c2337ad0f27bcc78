"""The decoding settings: one dataclass, torch-free, so that command-line parsers can take its defaults.

It is the schema of the `decoding` config group (nmt-evaluate, configs/decoding/), the keyword arguments of
nmt.translator.Translator, and the source of nmt-translate's option defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.choices import Amp


@dataclass
class Decoding:
    """The schema of the `decoding` config group (nmt-evaluate); Translator's keyword arguments."""

    beam_size: int = 1  # 1: greedy
    nbest: int = 1
    length_penalty: float = 1.0  # GNMT alpha: score / ((5 + length) / 6) ** alpha
    max_len_ratio: float = 1.5  # output at most ratio * source length + max_len_extra pieces
    max_len_extra: int = 10
    batch_tokens: int = 4000  # padded source pieces per decoding batch (docs/performance.md, "Decoding batches")
    amp: Amp = Amp.auto  # auto (bf16 autocast where the hardware has bf16) | bf16 | off
