"""The training progress bar: its estimate from the recent step rate, its end from the budget that ends first.

    bar = TrainingBar(total_steps=4000, step=0, max_minutes=5, spent=0.0, enabled=True)
    bar.advance(spent)        # after each step; `spent`: seconds of training so far (resumes included)

tqdm's own estimate divides the steps left by a rate smoothed since the bar began, and its end is the step or
epoch budget: a run stopped by trainer.max_minutes after five minutes was promised nine hours. Here
the rate is that of the last RECENT steps, so a machine that got busier (or quieter) shows at once, and where
trainer.max_minutes is set the bar ends where that budget will stop the run, if it comes first.
"""

from __future__ import annotations

import time
from collections import deque

from tqdm import tqdm

RECENT = 50  # steps the rate is measured over


class TrainingBar(tqdm):
    """A tqdm bar of training steps (see the module's docstring)."""

    def __init__(
        self, total_steps: int | None, step: int, max_minutes: float | None, spent: float, enabled: bool
    ) -> None:
        self.steps_total = total_steps
        self.budget = None if max_minutes is None else max_minutes * 60
        self.times: deque[float] = deque([time.perf_counter()], maxlen=RECENT + 1)  # before tqdm draws
        super().__init__(
            total=total_steps, initial=step, disable=not enabled, unit="step", dynamic_ncols=True, desc="train"
        )

    def recent_rate(self) -> float | None:
        """Steps per second over the last RECENT steps; None before the first."""
        if len(self.times) < 2 or self.times[-1] <= self.times[0]:
            return None
        return (len(self.times) - 1) / (self.times[-1] - self.times[0])

    def advance(self, spent: float) -> None:
        """One step done; `spent`: the seconds of training so far (those of earlier runs resumed included)."""
        self.times.append(time.perf_counter())
        self._fit_total(spent)
        self.update(1)

    def _fit_total(self, spent: float) -> None:
        rate = self.recent_rate()
        if self.budget is None or rate is None:
            return
        by_time = self.n + 1 + int(rate * max(0.0, self.budget - spent))  # where max_minutes will stop the run
        self.total = by_time if self.steps_total is None else min(self.steps_total, by_time)

    @property
    def format_dict(self) -> dict:
        """tqdm's fields, with the recent rate in place of tqdm's smoothed one (its estimate divides by it)."""
        fields = super().format_dict
        rate = self.recent_rate()
        if rate is not None:
            fields["rate"] = rate
        return fields
