"""Dropout whose random mask costs less on the CPU: three 16-bit uniforms from every 64-bit random draw.

    self.dropout = Dropout(0.2)      # in place of nn.Dropout(0.2): same parameters (none), same behaviour

On the CPU, `nn.Dropout` draws one random number per element (torch's bernoulli_), and in the decoder, which
drops out its (B, H) state at every step, that was about 5% of a training step on the machines measured.
Here each 64-bit draw from torch's generator (`random_()` on int64, 63 random bits) gives three independent
16-bit uniforms u, and an element is kept when u >= round(p * 65536), with probability 1 - round(p * 65536)
/ 65536 (p = 0.2: 0.2 exactly to 5 decimal places); kept elements are scaled by 1 / (1 - p), as
nn.Dropout does. Where the run's plan uses dropout_mask (nmt.plan), the words become the mask in one C++ pass
(nmt.kernels.keep_mask: the same numbers). The numbers come from torch's default generator, so seeding,
checkpointed RNG state and resumed runs behave as with nn.Dropout (the masks themselves differ from
nn.Dropout's). On other devices this is F.dropout.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.kernels.keep_mask import keep_mask_from

FIELD = 1 << 16  # values of one 16-bit uniform
_FIELDS = slice(0, 3) if sys.byteorder == "little" else slice(1, 4)  # the three int16s under bit 48 of an int64


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype) -> Tensor:
    """A CPU tensor of `shape`: 1 / (1 - p) where an element is kept, 0 where it is dropped (probability p,
    rounded to a multiple of 1 / 65536)."""
    n = math.prod(shape)
    words = torch.empty((n + 2) // 3, dtype=torch.int64).random_()  # each: 63 random bits, [0, 2^63)
    threshold = round(p * FIELD) - FIELD // 2
    if dtype == torch.float32:  # one C++ pass where the compiled kernels run (nmt.kernels.keep_mask)
        mask = keep_mask_from(words, n, threshold, 1.0 / (1.0 - p))
        if mask is not None:
            return mask.view(shape)
    fields = words.view(torch.int16).view(-1, 4)[:, _FIELDS].reshape(-1)[:n]  # n uniforms in [-2^15, 2^15)
    return (fields >= threshold).to(dtype).mul_(1.0 / (1.0 - p)).view(shape)


class Dropout(nn.Module):
    """nn.Dropout(p) with keep_mask's cheaper mask on the CPU (F.dropout elsewhere)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return x * keep_mask(x.shape, self.p, x.dtype)

    def mask(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor | None:
        """The CPU mask `forward` would multiply an input of `shape` by (the same draw), or None where
        `forward` returns its input unchanged (not training, or p = 0): for code that applies it itself
        (nmt.kernels.feed_loop)."""
        if not self.training or self.p == 0.0:
            return None
        return keep_mask(shape, self.p, dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"
