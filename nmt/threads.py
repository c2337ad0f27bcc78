"""How many CPU threads training computes on (trainer.threads), chosen for the machine as it is.

    trainer.threads=auto       (the default) as many as torch would use, less the cores other processes keep busy
    trainer.threads=adaptive   auto at the start, then checked again at every log line (trainer.log_every): the
                               count follows the load, and the run cannot be repeated exactly (its record says so)
    trainer.threads=N          N threads, whatever the load
    trainer.threads=null       torch's own count (OMP_NUM_THREADS, else the cores), as before `auto` existed

    threads = Threads("auto")          # measures, sets torch's count and logs the choice and why
    threads.count, threads.why         # 1, "other processes keep 1.02 of 2 cores busy"

Why: OpenMP's threads meet at the end of every parallel region. When another process holds one of two cores,
the thread that shares it arrives late at every meeting and the other spins waiting for it: on a 2-core Intel
Xeon the quick preset's 200 steps took a median 234.8 s of training at two threads beside one busy process, 8.4 s
at one thread (`python scripts/busy_machine.py`, docs/benchmark/busy_machine_quick_amx-xeon.json). So `auto`
never puts a thread on a core that another process keeps busy.

The load is read from /proc/stat: the time the cores of this process's affinity set spent busy, less the time
this process itself ran (os.times), over LOAD_WINDOW seconds; that is what other processes use. A core counts
as free when other processes use less than NOISE of it (shells, daemons). Where /proc/stat cannot be read
(not Linux), `auto` keeps torch's count and says so. `auto` never chooses more threads than torch would use,
so OMP_NUM_THREADS and a count set before (torch.set_num_threads) are ceilings.

The count changes a run's numbers (a sum split over more threads rounds differently), so a checkpoint records
it (the fact `threads`, nmt.resume) and a resume keeps it: with auto or adaptive the checkpoint's count is taken
again whatever the load now; an explicit count that differs is refused unless trainer.resume_changes=allow.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import torch

from nmt.errors import ConfigError

log = logging.getLogger(__name__)

LOAD_WINDOW = 0.3  # seconds the load is measured over at the start
NOISE = 0.25  # a core is free when other processes use less than this much of it
ADAPT_EVERY = 2.0  # adaptive: the least number of seconds between two measurements
CHOICES = ("auto", "adaptive")


def parse(value: object) -> str | int | None:
    """trainer.threads as given (auto, adaptive, a number as int or str, or None): checked, as "auto",
    "adaptive", an int >= 1, or None."""
    if value is None or value in CHOICES:
        return value
    try:
        count = int(str(value))
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(
            f"trainer.threads={value}: use auto (the default: the cores other processes leave free), adaptive "
            "(auto, checked again while training) or a number of threads, 1 or more"
        )
    return count


@dataclass(frozen=True)
class Load:
    """What other processes use of this process's cores, measured over `seconds`."""

    cores: int  # the cores this process may run on (its affinity set)
    others: float  # cores' worth of time other processes ran: 1.0 is one core kept busy
    seconds: float


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def cpu_seconds(cores: list[int]) -> tuple[float, float] | None:
    """(seconds `cores` spent busy since boot, seconds this process ran), from /proc/stat and os.times; None
    where /proc/stat cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cores}
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:  # user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy
            values = [int(x) for x in fields[:8]]
            ticks += sum(values) - values[3] - values[4]
    own = os.times()
    return ticks / os.sysconf("SC_CLK_TCK"), own.user + own.system


class LoadMeter:
    """The load since the last reading: `read()` returns the Load of the interval since the previous call (or
    since the meter was made), or None where it cannot be measured."""

    def __init__(self):
        self.cores = _cores()
        self._last = (time.monotonic(), cpu_seconds(self.cores))

    def age(self) -> float:
        """Seconds since the last reading."""
        return time.monotonic() - self._last[0]

    def read(self) -> Load | None:
        now = (time.monotonic(), cpu_seconds(self.cores))
        (t0, c0), (t1, c1) = self._last, now
        self._last = now
        if c0 is None or c1 is None or t1 <= t0:
            return None
        busy, own = c1[0] - c0[0], c1[1] - c0[1]
        return Load(len(self.cores), max(0.0, (busy - own) / (t1 - t0)), t1 - t0)


def choose(ceiling: int, load: Load | None) -> tuple[int, str]:
    """(threads, why): the cores other processes leave free, at least 1 and at most `ceiling`."""
    if load is None:
        return ceiling, f"the load cannot be measured here (no /proc/stat): torch's {ceiling}"
    free = load.cores - load.others
    count = max(1, min(ceiling, math.floor(free + NOISE)))
    busy = f"other processes keep {load.others:.2f} of {load.cores} cores busy"
    if count == ceiling:
        return count, f"{busy}; torch would use {ceiling}"
    return count, f"{busy}, so {count} of torch's {ceiling} (a thread on a busy core stalls the others)"


class Threads:
    """The thread count of a training run: chosen (and set) when made, kept on resume, adapted when asked."""

    def __init__(self, setting: object, window: float = LOAD_WINDOW):
        self.setting = parse(setting)
        self.changes: list[dict] = []  # adaptive: {step, from, to, why}
        self._ceiling = torch.get_num_threads()
        self._meter: LoadMeter | None = None
        self._pending: int | None = None
        if isinstance(self.setting, int):
            self.count, self.why = self.setting, "as asked"
        elif self.setting is None:
            self.count, self.why = self._ceiling, "torch's default"
        elif self._ceiling == 1 and self.setting == "auto":
            self.count, self.why = 1, "torch would use 1 (OMP_NUM_THREADS=1, one core, or set before)"
        else:
            self._meter = LoadMeter()
            time.sleep(window)
            self.count, self.why = choose(self._ceiling, self._meter.read())
        torch.set_num_threads(self.count)
        log.info("threads: %d (trainer.threads=%s: %s)", self.count, _show(self.setting), self.why)
        if self.setting == "adaptive":
            log.info(
                "trainer.threads=adaptive: the count may change while training, which changes the numbers: this "
                "run cannot be repeated exactly (its checkpoints and metrics.json list the changes)"
            )

    def resume(self, checkpoint: dict) -> None:
        """Continue the run of `checkpoint` (its `threads` record, as `record()` wrote it; in a checkpoint older
        than that record, the count its provenance gives): auto and adaptive take its count again, as the numbers
        depend on it. An explicit count is left as asked; the resume check (nmt.resume) compares the two."""
        saved = checkpoint.get("threads") or {"count": checkpoint.get("provenance", {}).get("threads")}
        self.changes = [*saved.get("changes", []), *self.changes]
        kept, now, why = saved["count"], self.count, self.why
        if kept is None or kept == now or self.setting not in CHOICES:
            return
        self.count, self.why = kept, f"the checkpoint's count, kept as the count changes the numbers; now {why}"
        torch.set_num_threads(kept)
        slower = kept > now  # more threads than the cores other processes leave free
        log.log(
            logging.WARNING if slower else logging.INFO,
            "threads: %d, the checkpoint's, kept (trainer.threads=%s would choose %d now: %s)%s",
            kept,
            self.setting,
            now,
            why,
            f"; trainer.threads={now} trainer.resume_changes=allow trades exactness for speed" if slower else "",
        )

    def adapt(self, step: int) -> None:
        """adaptive: measure the load since the last call and follow it, once the same new count is chosen
        twice in a row (a burst does not move it); recorded in `changes`."""
        if self._meter is None or self.setting != "adaptive":
            return
        if self._meter.age() < ADAPT_EVERY:
            return
        count, why = choose(self._ceiling, self._meter.read())
        if count == self.count or count != self._pending:
            self._pending = count if count != self.count else None
            return
        self.changes.append({"step": step, "from": self.count, "to": count, "why": why})
        log.warning("threads: %d -> %d at step %d (trainer.threads=adaptive: %s)", self.count, count, step, why)
        self.count, self.why, self._pending = count, why, None
        torch.set_num_threads(count)

    def record(self) -> dict:
        """What the run's record says: the setting, the count now and why, and adaptive's changes."""
        return {"setting": _show(self.setting), "count": self.count, "why": self.why, "changes": list(self.changes)}


def _show(setting: object) -> str:
    return "null" if setting is None else str(setting)
