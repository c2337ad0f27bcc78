"""Counting the operators a piece of code dispatches, on any device: what a GPU step's launches are made of.

On a CUDA GPU a training step of this model is bound by issuing work: each operator is a kernel launch (or a
view, which costs its dispatch alone), a few microseconds each, whatever the tensor's size. How many a step
dispatches can be counted on a CPU: the operators are the same, only their kernels differ.

    with DispatchCount() as count:
        trainer._train_step(group)
    count.total, count.launches, count.by_op.most_common(10), count.reads

`total` counts every operator; `launches` those that are not views (a view, slice or reshape launches no kernel
on a GPU, though it costs its dispatch; the ~13,600 a step of the multi30k_deen preset at 16,000 tokens counted
for the code before nmt.device_plan included them). `reads` lists the operators that, on a GPU,
read the device's data back to the host or size their output by it, so the host waits for every kernel queued
before them: `.item()`, `float(t)`, `bool(t)` and `int(t)` (aten::_local_scalar_dense), nonzero, masked_select,
unique. On a CPU they cost nothing of the kind, so a CPU step may use them on host-side tensors (batch lengths);
the count records them on every device alike (`.tolist()` of a CPU tensor dispatches nothing: not seen).
The counter sees the operators of the thread it runs on only (a dispatch mode is per thread).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

# operators that wait for the device on a GPU (see the module docstring)
READS = ("_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive")


class DispatchCount(TorchDispatchMode):
    """Counts every aten operator dispatched inside `with`: by name, the views among them, and the READS."""

    def __init__(self):
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.by_op[func.__name__.split(".")[0]] += 1
        self.views += func.is_view
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    @property
    def launches(self) -> int:
        """The operators that are not views: on a GPU, each a kernel launch (or an allocation, a host-side op)."""
        return self.total - self.views

    @property
    def reads(self) -> dict[str, int]:
        return {name: n for name, n in self.by_op.items() if name in READS}


class HostSyncs(TorchDispatchMode):
    """Records, inside `with`, every operator that on a GPU would make the host wait for the device or stall
    the device's queue: a READS operator or `is_nonzero` on a device tensor (host tensors are free to read),
    a copy from host memory to a device (inside a step a copy from ordinary memory waits; the feed,
    nmt.device_batches, starts the step's copies from pinned memory before it) and a page-locked allocation
    (`pin_memory`, which waits for the device to allocate). On the meta device, whose tensors hold no data,
    a CPU runs a GPU step's operators and this names what the GPU would wait on.

        with HostSyncs() as syncs:
            loss.backward()
        assert not syncs.found, syncs.found   # [(why, operator), ...]
    """

    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        tensors = [a for a in args if isinstance(a, Tensor)]
        on_device = [t for t in tensors if t.device.type != "cpu"]
        if name in (*READS, "is_nonzero") and on_device:
            self.found.append(("reads a device tensor", name))
        elif name in ("_pin_memory", "pin_memory"):
            self.found.append(("allocates pinned memory", name))
        elif name == "_to_copy" and tensors and tensors[0].device.type == "cpu":
            target = kwargs.get("device")
            if target is not None and torch.device(target).type != "cpu":
                self.found.append(("copies from the host", name))
        elif name == "copy_" and len(tensors) >= 2 and tensors[0].device.type != "cpu":
            if tensors[1].device.type == "cpu" and tensors[1].dim() > 0:  # a 0-dim host scalar is an argument
                self.found.append(("copies from the host", name))
        return func(*args, **kwargs)
