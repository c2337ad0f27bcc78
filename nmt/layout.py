"""A training batch's layout, worked out on the host from its lengths and handed to the model on the device.

    layout = batch_layout(batch.src_lengths, batch.tgt_lengths, T, step_multiple)   # on the host
    layout = layout.pin_memory().to(device, non_blocking=True)                     # by the feed, ahead
    logits, _ = model(src, src_lengths, tgt_in, rows, tgt_lengths, layout=layout, weights=False)

Two index tensors of a step follow from the lengths alone: the packed encoder's order (the sentences by source
length, longest first) and where the decoder loop's rows stand among the B x T positions (step t computes the
first active[t] sentences, nmt.decoder.active_rows). Made inside the step, each is a copy from ordinary host
memory to the device, which on a GPU waits for every kernel queued before it (a host synchronisation), and the
packed order's pinned copy costs a page-locked allocation. The feed (nmt.device_batches) makes them with the
batch instead, where the device is not the CPU, and copies them as it copies the batch: without waiting.
On a CPU the host is the device and the model makes them itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.decoder import active_rows
from nmt.kernels.decoder_loop import loop_positions


@dataclass(frozen=True)
class BatchLayout:
    src_order: Tensor  # (B,) long: the sentences by source length, longest first (the packed encoder's order)
    loop_positions: Tensor  # (N,) long: flat B x T positions of the decoder loop's rows, step after step
    step_multiple: int  # each step's rows rounded up to this (nmt.decoder.STEP_ROW_MULTIPLE under autocast, or 1)

    def pin_memory(self) -> BatchLayout:
        return BatchLayout(self.src_order.pin_memory(), self.loop_positions.pin_memory(), self.step_multiple)

    def to(self, device: torch.device, non_blocking: bool = False) -> BatchLayout:
        order, positions = (t.to(device, non_blocking=non_blocking) for t in (self.src_order, self.loop_positions))
        return BatchLayout(order, positions, self.step_multiple)


def batch_layout(src_lengths: Tensor, tgt_lengths: Tensor, T: int, step_multiple: int) -> BatchLayout:
    """The layout of a batch whose sources and targets have these lengths (B,) on the host, its teacher-forced
    input T positions long (BOS + target: tgt_lengths counts EOS instead of BOS, the same number)."""
    order = torch.sort(src_lengths, descending=True)[1]  # as the packed encoder sorts (nmt.encoder._pack)
    active = active_rows(torch.empty(len(tgt_lengths), T), step_multiple, tgt_lengths)
    return BatchLayout(order, loop_positions(active, T, torch.device("cpu")), step_multiple)
