"""An exponential moving average of the weights over the training steps (trainer.average_decay).

Adam at a constant learning rate leaves the weights of any one step noisy; their average over the last few
hundred steps translates better. After each optimizer step

    average <- d average + (1 - d) weights,   d = min(decay, (1 + step) / (10 + step))

(TensorFlow's ExponentialMovingAverage with num_updates; OpenNMT-py's -average_decay and fairseq's --ema-decay do
the same): early on d is small, so the average follows the weights, and it reaches `decay` after about
10 / (1 - decay) steps (4,500 at 0.998). Training steps from the weights, never from the average: the average
is what validation scores, what best.pt is chosen by, and what nmt-translate / nmt-evaluate / nmt-serve
translate with (nmt.restore). A checkpoint holds both (`model`: the weights, for resuming exactly;
`average`: {"decay", "model"}), twice the weights on disk.

    average = weight_average(model, decay)  # None without a decay
    average.update(model, step)          # after optimizer step number `step` (1, 2, ...)
    with average.applied(model): ...     # the model holds the average inside the block (validation)
    payload["average"] = average.state(model)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from nmt.errors import ConfigError

log = logging.getLogger(__name__)


def check_decay(decay: float | None) -> None:
    """A ConfigError unless `decay` (trainer.average_decay) is None or lies strictly between 0 and 1."""
    if decay is not None and not 0.0 < decay < 1.0:
        raise ConfigError(f"trainer.average_decay={decay}: a decay lies between 0 and 1 (0.998, say; null: none)")


def weight_average(model: nn.Module, decay: float | None) -> WeightAverage | None:
    """The average of `model`'s weights with `decay` (trainer.average_decay), said in the log; None without one."""
    if not decay:
        return None
    log.info(
        "weights averaged over the steps (trainer.average_decay=%g): validation, best.pt and translations "
        "use the average, training steps from the weights",
        decay,
    )
    return WeightAverage(model, decay)


class WeightAverage:
    """The average of `model`'s parameters (its buffers are taken as they are when it is applied or saved)."""

    def __init__(self, model: nn.Module, decay: float):
        check_decay(decay)
        self.decay = decay
        named = list(model.named_parameters())
        self.names = [n for n, _ in named]
        self.values = [p.detach().clone() for _, p in named]  # starts at the weights

    def update(self, model: nn.Module, step: int) -> None:
        """Fold in the weights after optimizer step number `step` (the first step is 1)."""
        d = min(self.decay, (1 + step) / (10 + step))
        torch._foreach_lerp_(self.values, [p.detach() for p in model.parameters()], 1.0 - d)

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """Inside the block the model holds the average (its own weights restored after, bit for bit)."""
        params = [p.detach() for p in model.parameters()]
        saved = [p.clone() for p in params]
        torch._foreach_copy_(params, self.values)
        try:
            yield
        finally:
            torch._foreach_copy_(params, saved)

    def state(self, model: nn.Module) -> dict:
        """For a checkpoint: the decay and the model's state dict with the averaged parameters."""
        weights = model.state_dict()
        weights.update(zip(self.names, self.values, strict=True))
        return {"decay": self.decay, "model": weights}

    def load(self, state: dict) -> None:
        """Continue from a checkpoint's `average` (its decay is this run's: trainer.average_decay may change)."""
        weights = state["model"]
        missing = [n for n in self.names if n not in weights]
        if missing:
            raise KeyError(f"the checkpoint's averaged weights lack {', '.join(missing[:3])}")
        torch._foreach_copy_(
            self.values, [weights[n].to(v.device, v.dtype) for n, v in zip(self.names, self.values, strict=True)]
        )
