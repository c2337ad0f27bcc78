"""The optimizer and the learning rate of every step.

    optimizer = build_optimizer(module, optim, device)        # Adam or AdamW, fused on CPU and CUDA
    rate = LearningRate(optimizer, optim, best_metric)
    rate.start()                                              # before the first step (after a resume's load too)
    rate.set(step)                                            # before each step: the base rate, warmed up
    rate.validated(metric)                                    # after each validation: the plateau schedule's cut

Each parameter group keeps its base rate in `base_lr`: optim.lr, or the rate a plateau cut left. The linear
warmup (optim.warmup_steps, any schedule) scales it, so a cut during warmup cuts the full rate, not the part of it
warmed up so far.
"""

from __future__ import annotations

import torch

from nmt.choices import Optimizer
from nmt.trainer.config import OptimConfig


def build_optimizer(module: torch.nn.Module, optim: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    kind = {Optimizer.adam: torch.optim.Adam, Optimizer.adamw: torch.optim.AdamW}[optim.name]
    fused = device.type in ("cpu", "cuda")  # one kernel over all parameters instead of a loop
    return kind(
        module.parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay, fused=fused or None
    )


class LearningRate:
    def __init__(self, optimizer: torch.optim.Optimizer, optim: OptimConfig, best_metric: str):
        self.optimizer, self.optim = optimizer, optim
        self.plateau = None
        if optim.schedule == "plateau":
            mode = "min" if best_metric in ("loss", "ppl") else "max"
            self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer,
                mode=mode,
                factor=optim.plateau_factor,
                patience=optim.plateau_patience,
                min_lr=optim.min_lr,
            )

    def start(self) -> None:
        """Every group's base rate is its rate where none was restored."""
        for g in self.optimizer.param_groups:
            g.setdefault("base_lr", g["lr"])

    def now(self, step: int) -> float:
        """The rate of step number `step` + 1 (`step` steps taken)."""
        base = self.optimizer.param_groups[0].get("base_lr", self.optim.lr)
        if self.optim.warmup_steps and step < self.optim.warmup_steps:
            return base * (step + 1) / self.optim.warmup_steps
        return base

    def set(self, step: int) -> None:
        lr = self.now(step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def validated(self, metric: float) -> None:
        """The plateau schedule's step on a validation's `metric`: a cut cuts the base rate alike."""
        if not self.plateau:
            return
        before = [g["lr"] for g in self.optimizer.param_groups]
        self.plateau.step(metric)
        for g, lr in zip(self.optimizer.param_groups, before, strict=True):
            if g["lr"] < lr:  # cut: cut the base rate alike (during warmup g["lr"] is only a part of it)
                g["base_lr"] *= g["lr"] / lr

    def state(self) -> dict:
        """For a checkpoint: the plateau schedule's state and every group's base rate."""
        return {
            "scheduler": self.plateau.state_dict() if self.plateau else {},
            "base_lr": [g.get("base_lr", self.optim.lr) for g in self.optimizer.param_groups],
        }

    def load(self, data: dict) -> None:
        """Continue from a checkpoint's `scheduler` and `base_lr` (the optimizer's state loaded before)."""
        for g, base in zip(self.optimizer.param_groups, data["base_lr"], strict=True):
            g["base_lr"] = base
        if self.plateau and data["scheduler"]:
            self.plateau.load_state_dict(data["scheduler"])
