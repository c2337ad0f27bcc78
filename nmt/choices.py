"""The closed sets of values a setting may take, each written once.

The config dataclasses (TrainerConfig, OptimConfig, TokenizerSettings, ModelConfig, Decoding) type their
fields with these enums, so Hydra rejects `trainer.amp=bf17` while composing ("Invalid value 'bf17',
expected one of [auto, bf16, off]", with the key). Library code called without Hydra checks a value with
`choice`. They are string enums: `Amp.off == "off"`, and str() and f-strings give "off".
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from nmt.errors import ConfigError


class Choice(str, Enum):
    """A string enum (enum.StrEnum from Python 3.11 on; this project supports 3.10)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Amp(Choice):
    """auto: bf16 autocast where the hardware has bf16 (CUDA; CPUs with AVX-512 BF16 or AMX)."""

    auto = "auto"
    bf16 = "bf16"
    off = "off"


class Kernels(Choice):
    """The setting `kernels`, shared by training and decoding: auto (each component's kernel where the run's plan
    finds it right: nmt.plan), eager (torch operations only); compiled insists on every kernel that applies (a
    failed build is an error), for tests and benchmarks."""

    auto = "auto"
    eager = "eager"
    compiled = "compiled"


class Bucketing(Choice):
    """exact: every batch's sources share one length (no encoder padding); sorted: lengths mixed."""

    exact = "exact"
    sorted = "sorted"


class Metric(Choice):
    """What chooses best.pt and drives the plateau schedule and early stopping."""

    bleu = "bleu"
    chrf = "chrf"
    loss = "loss"
    ppl = "ppl"


class Optimizer(Choice):
    adam = "adam"
    adamw = "adamw"


class Schedule(Choice):
    """constant; warmup (linear warmup, then constant); plateau (reduce the rate on a validation plateau)."""

    constant = "constant"
    warmup = "warmup"
    plateau = "plateau"


class ResumeChanges(Choice):
    """What resuming does when the run differs from its checkpoint in a setting an exact resume depends on
    (nmt.resume): refuse (say which, and stop) or allow (continue, and record the changed keys)."""

    refuse = "refuse"
    allow = "allow"


class TokenizerType(Choice):
    unigram = "unigram"
    bpe = "bpe"
    char = "char"
    word = "word"


class Bridge(Choice):
    """bridge: the decoder starts from tanh(W h_enc) of the encoder's final states; zero: from zeros."""

    bridge = "bridge"
    zero = "zero"


class Query(Choice):
    """current: Luong's order (h_t scores, h~ = tanh(W_c [c; h])); previous: Bahdanau's order (s_{t-1} scores,
    the context enters the LSTM step)."""

    current = "current"
    previous = "previous"


class LuongScore(Choice):
    dot = "dot"
    general = "general"
    concat = "concat"


E = TypeVar("E", bound=Choice)


def choice(kind: type[E], value: object, key: str) -> E:
    """`value` as a member of `kind`; anything else is a ConfigError naming `key` and the choices."""
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{key}={value!r}: use one of {', '.join(kind)}") from None
