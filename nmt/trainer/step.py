"""One optimizer step: each batch's forward and loss, the backward, the clipping and the update. What runs where
is chosen here, once, for the device: the precision (trainer.amp), then the run's plan (nmt.plan: each
component's implementation and why, the kernels and the allocator's thresholds among them, logged as a table)
and the device plan (nmt.device_plan: how a step's work is cut, how its batches are fed, when its numbers are
read).

    step = TrainingStep(model, module, optimizer, device, world_size, config, threads)
    loss, tokens, sentences = step(split, group, upcoming, group_tokens, taken)   # loss None: skipped

A step sums each batch's loss over its real target tokens and divides by the group's target tokens over all
ranks (`group_tokens`), so its gradient is the token-normalised gradient of the whole global batch. A step whose
loss or gradient is not finite makes no update; max_bad_steps of them in a row stop the run (NMTError).
"""

from __future__ import annotations

import logging
from contextlib import nullcontext

import torch
import torch.distributed as dist

from nmt.data import Batch, EncodedSplit
from nmt.decoder import STEP_ROW_MULTIPLE
from nmt.device_batches import DeviceBatches
from nmt.device_plan import DevicePlan, choose_plan, imposed
from nmt.errors import NMTError
from nmt.layout import BatchLayout
from nmt.loss import loss_sum, output_loss_sum
from nmt.model import Seq2Seq
from nmt.plan import plan_for_training
from nmt.precision import precision_choice
from nmt.step_numbers import StepNumbers
from nmt.threads import Threads
from nmt.trainer.config import TrainerConfig

log = logging.getLogger(__name__)


class TrainingStep:
    """`model` computes (the DDP wrapper under several processes), `module` is the bare model it wraps."""

    def __init__(
        self,
        model: torch.nn.Module,
        module: Seq2Seq,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        world_size: int,
        config: TrainerConfig,
        threads: Threads,
    ):
        self.model, self.module, self.optimizer, self.device = model, module, optimizer, device
        self.world_size, self.cfg = world_size, config
        bf16, why = precision_choice(config.amp, device.type, "trainer.amp")
        self.amp = "bf16" if bf16 else "off"  # resolved
        log.info("batches of %d tokens, %s bucketing", config.batch_tokens, config.bucketing)
        self.autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else nullcontext
        # every component's implementation and why (nmt.plan): chosen, applied and logged before the first step
        self.run_plan = plan_for_training(module, device.type, bf16, why, config, threads)
        # fp32 on a CPU: the output layer runs inside the loss, a piece of rows at a time (nmt.loss.output_loss_sum)
        self.output_in_loss = device.type == "cpu" and not bf16
        self.kernels = "compiled" if self.run_plan.kernels else "eager"  # a fact of exact resumes (nmt.resume)
        self.use_plan(choose_plan(device)[0])
        self.bad_steps = 0  # non-finite steps in a row
        self.last_grad_norm: float | torch.Tensor = 0.0  # the last update's (a device tensor until read)

    def use_plan(self, plan: DevicePlan) -> None:
        """Train with `plan` (nmt.device_plan): how a step's work is cut, how its batches are fed, and when its
        numbers are read."""
        self.plan, self.numbers = plan, StepNumbers(plan.deferred_checks)
        self.batches = DeviceBatches(plan, self.device, STEP_ROW_MULTIPLE if self.amp == "bf16" else 1)

    def __call__(
        self, split: EncodedSplit, group: list[list[int]], upcoming: list, group_tokens: int, taken: int
    ) -> tuple[float | torch.Tensor | None, int, int]:
        """One optimizer step over `group` (batches of `split`'s indices), `taken` steps taken before; `upcoming`:
        the next groups, that a plan with prefetch prepares meanwhile. Returns (summed loss, tokens, sentences), or
        (None, 0, 0) if skipped. The loss is a float, or a 0-dim device tensor where the plan reads it only when
        logging (nmt.step_numbers)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, n_sent = torch.zeros((), device=self.device), 0
        with imposed(self.plan.work):  # the loss's and the energy's pieces (nmt.device_plan)
            # each batch on the device with its loss rows, the real target positions and a few padded ones: (N,)
            for batch, rows, layout in self.batches.take(split, group, upcoming):
                loss = self.batch_loss(batch, rows, layout)
                # DDP averages gradients over ranks; scaling by world_size makes that a sum over the global batch
                (loss * self.world_size / group_tokens).backward()
                loss_total += loss.detach()
                n_sent += len(batch.indices)
        if self.world_size > 1:
            dist.all_reduce(loss_total)
        grad_norm = self.numbers.clip(self.module.parameters(), self.cfg.clip_norm)  # clip_grad_norm_
        if not self.numbers.admit(self.optimizer, loss_total, grad_norm):
            self.bad_steps += 1
            log.warning("step %d: non-finite loss or gradient; skipped (%d in a row)", taken + 1, self.bad_steps)
            self.optimizer.zero_grad(set_to_none=True)
            if self.bad_steps >= self.cfg.max_bad_steps:
                raise NMTError(
                    f"training diverged: {self.bad_steps} non-finite steps in a row at step {taken}; "
                    "lower optim.lr or trainer.clip_norm, or resume from checkpoints/last.pt"
                )
            return None, 0, 0
        self.bad_steps = 0
        self.optimizer.step()
        self.last_grad_norm = self.numbers.value(grad_norm)
        return self.numbers.value(loss_total), group_tokens, n_sent * self.world_size

    def batch_loss(self, batch: Batch, rows: torch.Tensor, layout: BatchLayout | None = None) -> torch.Tensor:
        """One batch's summed loss over its loss rows (N,) (nmt.loss.rows_of_lengths), as training takes it:
        under the run's autocast, and in fp32 on a CPU with the output layer inside the loss (`output_in_loss`);
        `layout`: the batch's index tensors on the device (nmt.layout), where the feed made them."""
        target, fused = batch.tgt_out.reshape(-1)[rows], self.output_in_loss  # (N,)
        with self.autocast():
            out, _ = self.model(
                batch.src, batch.src_lengths, batch.tgt_in, rows, batch.tgt_lengths, not fused, layout, False
            )
        if fused:  # out: the output layer's input (N, H)
            return output_loss_sum(out, self.module.decoder.output, target, self.cfg.label_smoothing)
        return loss_sum(out, target, self.cfg.label_smoothing)  # out: the logits (N, V)
