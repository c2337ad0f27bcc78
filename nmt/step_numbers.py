"""A training step's loss, gradient norm and non-finite check: read at once, or kept on the device until logged.

    numbers = StepNumbers(plan.deferred_checks)
    grad_norm = numbers.clip(model.parameters(), max_norm)  # clip_grad_norm_
    if not numbers.admit(optimizer, loss_total, grad_norm):  # read now: not finite, so the step is skipped
        ...
    optimizer.step()
    loss, norm = numbers.value(loss_total), numbers.value(grad_norm)  # floats, or 0-dim device tensors
    numbers.check(max_bad_steps, step)  # when logging: NMTError after max_bad_steps non-finite steps in a row

Read at once (a CPU's way, where reading costs nothing), a non-finite step is skipped by the caller and not
counted. Deferred (a GPU's way: each read makes the host wait for every kernel queued before it), nothing is
read in the step: the check is a flag on the device that the fused optimizer reads (`found_inf`, as torch's
GradScaler hands it over) and skips the update by, the step is counted, its loss counts as 0 in the logged
average, and the run of non-finite steps is read and checked when the trainer logs. The loss and the norm stay
0-dim device tensors until then (float() reads them).

Clipping likewise: read at once, the gradients are scaled only where their norm exceeds the bound; torch's
clip_grad_norm_ multiplies them by min(1, bound / norm) whatever it is (so that a GPU need not wait to read the
norm), a pass over every gradient for nothing where the norm is below the bound, as it is for most steps of
the presets. The gradients are the same
to the bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.errors import NMTError


class StepNumbers:
    def __init__(self, deferred: bool):
        self.deferred = deferred
        self._bad_run: Tensor | None = None  # deferred: non-finite steps in a row, () fp32 on the device

    def admit(self, optimizer: torch.optim.Optimizer, loss_total: Tensor, grad_norm: Tensor) -> bool:
        """Whether to take the optimizer step. Read at once: False where the loss or the gradient norm is not
        finite. Deferred (and a fused optimizer, which takes the flag): always True, the optimizer skipping the
        update itself where they are not finite."""
        if not (self.deferred and optimizer.defaults.get("fused")):
            return bool(torch.isfinite(loss_total)) and bool(torch.isfinite(grad_norm))
        bad = (~(torch.isfinite(loss_total) & torch.isfinite(grad_norm))).float()  # () 1 where not finite
        optimizer.found_inf = bad  # read by the fused Adam/AdamW kernels (torch.optim.adam._fused_adam)
        self._bad_run = bad if self._bad_run is None else (self._bad_run + 1) * bad
        self._finite = bad == 0
        return True

    def clip(self, parameters, max_norm: float) -> Tensor:
        """torch.nn.utils.clip_grad_norm_(parameters, max_norm): the gradients' total 2-norm (returned), and the
        gradients scaled by max_norm / (norm + 1e-6) where that is below 1; read at once, they are left
        untouched otherwise (not multiplied by 1). Deferred, torch's own."""
        if self.deferred:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        parameters = [p for p in parameters if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        if float(max_norm / (norm + 1e-6)) < 1.0:  # not finite: no scaling (admit skips the step)
            torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
        return norm

    def value(self, x: Tensor) -> float | Tensor:
        """A step's loss or gradient norm: a float read now, or deferred the 0-dim tensor (0 where the step was
        not finite)."""
        if self._bad_run is None:
            return float(x)
        return torch.where(self._finite, x.detach(), 0.0)

    def check(self, max_bad_steps: int, step: int) -> None:
        """Deferred: raise NMTError where the last max_bad_steps steps were all not finite (reads the device)."""
        if self._bad_run is None:
            return
        bad = int(self._bad_run)
        if bad >= max_bad_steps:
            raise NMTError(
                f"training diverged: {bad} non-finite steps in a row at step {step}; "
                "lower optim.lr or trainer.clip_norm, or resume from checkpoints/last.pt"
            )
