"""Training batches on the device, with their loss rows, prepared ahead of the step where the device plan says so.

    feed = DeviceBatches(plan, device)
    for batch, rows, layout in feed.take(split, group, upcoming):   # group: a step's batches (lists of indices)
        logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in, rows, batch.tgt_lengths, layout=layout)

A batch is collated (nmt.data.collate) and its loss rows counted from its target lengths on the host
(nmt.loss.rows_of_lengths), so nothing of it is read back from the device; where the device is not the CPU,
its layout too (nmt.layout: the packed encoder's order, the decoder loop's positions), so that the step copies
nothing from the host. On a GPU (DevicePlan.prefetch > 0)
a background thread does this for the `upcoming` groups, into pinned memory, while the device computes; the
training thread only starts their copies, which do not wait. On a CPU (prefetch 0) a group is prepared on the
training thread when the step asks for it, as it always was: a thread would take a core from the step.
Groups are matched by their sentences and split, so a new epoch, a resume or an unforeseen group is simply
prepared then; what was prepared for groups no longer upcoming is dropped.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import Tensor

from nmt.data import Batch, EncodedSplit, collate
from nmt.device_plan import DevicePlan
from nmt.layout import BatchLayout, batch_layout
from nmt.loss import rows_of_lengths

# a group's batches, their loss rows (N,) and their layouts (None on a CPU), on the host
Prepared = list[tuple[Batch, Tensor, BatchLayout | None]]


class DeviceBatches:
    """`step_multiple`: the decoder loop's rows per step rounded up to it (nmt.decoder.STEP_ROW_MULTIPLE under
    autocast, else 1), as the layouts must be made."""

    def __init__(self, plan: DevicePlan, device: torch.device, step_multiple: int = 1):
        self.plan, self.device, self.step_multiple = plan, device, step_multiple
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="nmt-batches") if plan.prefetch else None
        self._ahead: dict[tuple, tuple[EncodedSplit, Future[Prepared]]] = {}

    def take(self, split: EncodedSplit, group: list[list[int]], upcoming: list[list[list[int]]] = ()) -> Prepared:
        """`group`'s batches of `split`, loss rows and layouts, on the device (copies started, not waited for);
        then, where the plan prefetches, the first `plan.prefetch` groups of `upcoming` are prepared meanwhile."""
        ahead = self._ahead.pop(_key(group), None)
        if ahead is not None and ahead[0] is split:
            prepared = ahead[1].result()
        else:
            prepared = self._prepare(split, group)
        if self._pool is not None:
            wanted = {_key(g): g for g in upcoming[: self.plan.prefetch]}
            for key in [k for k, (s, _) in self._ahead.items() if k not in wanted or s is not split]:
                self._ahead.pop(key)[1].cancel()
            for key, g in wanted.items():
                if key not in self._ahead:
                    self._ahead[key] = (split, self._pool.submit(self._prepare, split, g))
        return [
            (
                batch.to(self.device, non_blocking=True),
                rows.to(self.device, non_blocking=True),
                None if layout is None else layout.to(self.device, non_blocking=True),
            )
            for batch, rows, layout in prepared
        ]

    def _prepare(self, split: EncodedSplit, group: list[list[int]]) -> Prepared:
        prepared = []
        for indices in group:
            batch = collate(split, indices)
            rows = rows_of_lengths(batch.tgt_lengths, batch.tgt_out.size(1))  # (N,) the loss's target positions
            layout = None
            if self.device.type != "cpu":
                T = batch.tgt_in.size(1)
                layout = batch_layout(batch.src_lengths, batch.tgt_lengths, T, self.step_multiple)
            if self.plan.pin_memory:
                batch, rows = batch.pin_memory(), rows.pin_memory()
                layout = None if layout is None else layout.pin_memory()
            prepared.append((batch, rows, layout))
        return prepared


def _key(group: list[list[int]]) -> tuple:
    return tuple(tuple(indices) for indices in group)
