"""What a training step does differently on each device, chosen in one place.

The arithmetic is the same everywhere; how it is cut up and when the host looks at it is not. On a CPU a step
is bound by passes over memory: the loss and the additive attention's energy work through pieces that stay in
the core's cache, and reading a number back (a loss, a count, a non-finite check) costs nothing. On a CUDA GPU
a step of this model is bound by issuing work (a few microseconds an operator, whatever its size: before this
plan a step at 16,000 tokens dispatched ~13,600 operators and reached 0.2% of an H200's bf16 rate, measured on
that GPU): the same pieces are thousands of operators, and each read of the device's data makes
the host wait for everything queued before it. So the CUDA plan takes the loss in one call and the energy in
one piece a step, prepares batches ahead in a thread (pinned memory, copies that do not wait), and keeps a
step's non-finite check on the device as a flag (the fused optimizer skips the update itself, as with torch's
GradScaler), its loss and gradient norm read only when the trainer logs. The CPU plan is what the CPU always did.

    plan, why = choose_plan(device)          # the Trainer, once: its "device plan" log line says why
    sizes = work_sizes(tensor.device)        # nmt.loss, nmt.kernels.energy: how big a piece
    order = to_device(order, states.device)  # nmt.encoder: a host tensor copied over without waiting
    with imposed(CUDA.work): ...             # another device's sizes on these tensors (tests, scripts/step_ops.py)

The CUDA plan's choices follow that count and one measurement (the loss and the energy each in one
piece trained 2.8x faster on an H200); the rest of it (prefetching, the deferred checks) is unmeasured on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WorkSizes:
    """How much of a step's work one call takes."""

    loss_rows: int | None  # target positions per piece of the loss (nmt.loss); None: all of them in one call
    energy_elements: int  # (rows, S, A) elements per piece of the additive energy (nmt.kernels.energy)


@dataclass(frozen=True)
class DevicePlan:
    device: str  # the device type it was made for ("cpu", "cuda")
    work: WorkSizes
    pin_memory: bool  # batches collated into page-locked memory, so that their copies to the device do not wait
    prefetch: int  # batches collated ahead in a background thread (0: on the training thread, when needed)
    deferred_checks: (
        bool  # non-finite check as a device flag; loss and gradient norm read when logged (nmt.step_numbers)
    )

    def describe(self) -> str:
        """The plan in words, for the Trainer's log line."""
        loss = "in one call" if self.work.loss_rows is None else f"{self.work.loss_rows} target rows at a time"
        mib = self.work.energy_elements * 4 / 2**20
        feed = f"{self.prefetch} batches collated ahead" if self.prefetch else "batches collated when needed"
        if self.pin_memory:
            feed += " into pinned memory"
        checks = "kept on the device, read when logged" if self.deferred_checks else "read at every step"
        return f"the loss {loss}, the energy in pieces of {mib:g} MiB, {feed}, the step's numbers {checks}"


# The loss: an fp32 piece of 16 rows of the logits (512 KiB at 8k pieces) stays in cache. The energy: a piece's
# (rows, S, A) buffer of 2^18 fp32 elements (1 MiB) stays within a core's L2.
CPU = DevicePlan("cpu", WorkSizes(loss_rows=16, energy_elements=1 << 18), False, 0, False)
# One call each: a 16,000-token step's energy is one piece per decoder step (B x S x A is at most 16,000 x 512),
# and the pieces of a whole-sequence call (query=current without input feeding) stay under 512 MiB.
CUDA = DevicePlan("cuda", WorkSizes(loss_rows=None, energy_elements=1 << 27), True, 2, True)
PLANS = {"cpu": CPU, "cuda": CUDA}

_imposed: list[WorkSizes] = []


def choose_plan(device: torch.device | str) -> tuple[DevicePlan, str]:
    """The plan for `device`, and why, in words for the Trainer's log line."""
    kind = torch.device(device).type
    if kind in PLANS:
        return PLANS[kind], f"{kind}: {PLANS[kind].describe()}"
    return CPU, f"{kind}: no plan made for it, the CPU's ({CPU.describe()})"


def work_sizes(device: torch.device | str) -> WorkSizes:
    """The work sizes for tensors on `device`: its plan's, or those imposed (innermost `imposed`)."""
    if _imposed:
        return _imposed[-1]
    return PLANS.get(torch.device(device).type, CPU).work


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor (an order, lengths) on `device`, copied without the host waiting for the device:
    through pinned memory where the device's plan pins. A plain `.to(device)` from ordinary memory waits for
    everything queued on a GPU first (a host synchronisation)."""
    if x.device == device:
        return x
    if PLANS.get(device.type, CPU).pin_memory:
        x = x.pin_memory()
    return x.to(device, non_blocking=True)


@contextmanager
def imposed(sizes: WorkSizes) -> Iterator[WorkSizes]:
    """Inside `with`, every device's work is cut by `sizes` (process-wide, like torch.backends' settings): another
    device's sizes measured on this one, or small pieces in a test."""
    _imposed.append(sizes)
    try:
        yield sizes
    finally:
        _imposed.pop()
