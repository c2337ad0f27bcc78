"""A run's health, window by window: the rate, the process's page faults and the machine's other runnable
processes every 50 optimizer steps, and the flags that keep an unfair comparison from passing unseen.

    windows = Windows(every=50)          # a Trainer hook: Trainer(..., hooks=[windows]) (scripts/benchmark.py)
    windows.records                      # one dict a window: steps, seconds, rates, faults, other runnable
    report = health(windows.records, threads=2)   # median rate, spread, shared cores and the flags in words

Two runs of the same code can differ by several times where other programs take turns on the run's cores (a
2-thread step waits at every barrier for a preempted thread) or where the first touches of fresh memory are slow:
their averages alone do not tell such a run from a healthy one. So each window records its rate in target
tokens a second of wall clock (its validations left out), the minor and major page faults the process took in it
(getrusage), and the other runnable processes: /proc/stat's procs_running, sampled after every step, less this
process's own running threads (/proc/self/task). A run is flagged where its full windows' rates spread more than
SPREAD (max - min over the median), or where other processes were runnable beyond the cores the run left free.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

EVERY = 50  # steps a window
SPREAD = 0.25  # the largest (max - min) / median of the full windows' rates that passes


def faults() -> tuple[int, int]:
    """This process's (minor, major) page faults so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_majflt


def others_runnable(proc: Path = Path("/proc")) -> int | None:
    """Runnable threads on the machine now, less this process's own (None where /proc cannot be read)."""
    try:
        running = next(
            int(line.split()[1])
            for line in (proc / "stat").read_text().splitlines()
            if line.startswith("procs_running")
        )
        ours = 0
        for task in (proc / "self" / "task").iterdir():
            try:
                ours += (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
            except (OSError, IndexError):  # a thread that ended meanwhile
                pass
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return max(running - ours, 0)


class Windows:
    """A Trainer hook (on_step, on_validation) that closes a window every `every` optimizer steps; `clock`,
    `faults` and `others` are read at every step (injected in tests)."""

    def __init__(
        self,
        every: int = EVERY,
        clock: Callable[[], float] = time.perf_counter,
        faults: Callable[[], tuple[int, int]] = faults,
        others: Callable[[], int | None] = others_runnable,
    ):
        self.every, self.clock, self.faults, self.others = every, clock, faults, others
        self.records: list[dict] = []
        self._open(None)

    def _open(self, first_step: int | None) -> None:
        self.first, self.start, self.start_faults = first_step, self.clock(), self.faults()
        self.sentences = self.tokens = self.steps = 0
        self.valid_seconds = 0.0
        self.samples: list[int] = []

    def on_step(self, trainer, seconds: float, sentences: int, tokens: int, skipped: bool) -> None:
        if self.first is None:
            self.first = trainer.step
        self.steps += 1
        if not skipped:
            self.sentences += sentences
            self.tokens += tokens
        sample = self.others()
        if sample is not None:
            self.samples.append(sample)
        if self.steps >= self.every:
            self.close(trainer.step)

    def on_validation(self, trainer, seconds: float) -> None:
        self.valid_seconds += seconds  # inside the window's wall clock, outside its rate

    def close(self, last_step: int | None = None) -> None:
        """Record the open window (a last, partial one where `steps` < every) and open the next."""
        if self.steps:
            seconds = max(self.clock() - self.start - self.valid_seconds, 1e-9)
            minor, major = (now - then for now, then in zip(self.faults(), self.start_faults, strict=True))
            self.records.append(
                {
                    "steps": [self.first, last_step if last_step is not None else self.first + self.steps - 1],
                    "full": self.steps >= self.every,
                    "seconds": round(seconds, 3),
                    "valid_seconds": round(self.valid_seconds, 3),
                    "target_tokens_per_s": round(self.tokens / seconds, 1),
                    "sentences_per_s": round(self.sentences / seconds, 2),
                    "minor_faults": minor,
                    "major_faults": major,
                    "minor_faults_per_s": round(minor / seconds, 1),
                    "others_runnable_mean": round(statistics.fmean(self.samples), 3) if self.samples else None,
                    "others_runnable_max": max(self.samples) if self.samples else None,
                }
            )
        self._open(None)


def health(records: list[dict], threads: int, cores: int | None = None) -> dict:
    """The full windows' median rate and spread, whether other processes shared the run's cores (runnable
    beyond the `cores` less `threads` it left free, half a process on average in some window), and the flags."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    full = [r for r in records if r["full"]] or records
    rates = [r["target_tokens_per_s"] for r in full]
    report: dict = {"windows": len(records), "full_windows": len([r for r in records if r["full"]]), "flags": []}
    if not rates:
        return report
    median = statistics.median(rates)
    spread = (max(rates) - min(rates)) / median if median else 0.0
    lowest = min(rates) / median if median else 1.0
    free = max(cores - threads, 0)
    busy = [r for r in full if (r["others_runnable_mean"] or 0) >= free + 0.5]
    report.update(
        median_target_tokens_per_s=median,
        spread=round(spread, 3),
        lowest_over_median=round(lowest, 3),
        cores=cores,
        threads=threads,
        shared_windows=[r["steps"] for r in busy],
    )
    if spread > SPREAD:
        report["flags"].append(
            f"windows spread {spread:.0%} (> {SPREAD:.0%}): {min(rates):,.0f} to {max(rates):,.0f} target tokens/s, "
            f"median {median:,.0f}"
        )
    if busy:
        worst = max(r["others_runnable_mean"] for r in busy)
        report["flags"].append(
            f"shared its cores: other processes runnable beyond the {free} free core(s) in {len(busy)} of "
            f"{len(full)} windows (up to {worst:.2f} on average in one)"
        )
    return report
