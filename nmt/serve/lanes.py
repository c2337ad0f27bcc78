"""Each checkpoint's translations in two lanes, each a thread running one request at a time, the earliest deadline
first (nmt/serve/app.py).

    lanes = Lanes("nmt-model0")
    future = lanes.submit(len(text) * beam, model.translate, text, beam, max_pieces)   # a concurrent.futures.Future
    # called as model.translate(text, beam, max_pieces, short): short is True in the short lane

Served in order of arrival, a three-word request waited behind every long one before it: six clients asking for
150-word pages kept each checkpoint busy for seconds. So each request gets a deadline, its arrival plus
SECONDS_PER_UNIT for each unit of its cost (the characters of its text times its beam), and a lane runs the
earliest deadline first: a short request overtakes the long ones waiting, and a long one is overtaken only by
requests that came less than its own allowance after it (10 s for 1,000 characters, greedy), so none waits for
ever. A translation in progress is never interrupted, though, and on a busy machine a 100-piece one with
self-attention took seconds; once long requests had waited past their allowance they came first again, and a
three-word request waited for two or three of them. So requests of cost up to SHORT (200 characters greedy, 40
with a beam of 5) have a lane of their own beside the long one: a short request never waits for a long one, and
a checkpoint translates at most two requests at once (nmt.serve.models.ServedModel: a lock per lane).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

SECONDS_PER_UNIT = 0.01  # a request's allowance for each character of its text, times its beam
SHORT = 200  # the most cost (characters times beam) of a request of the short lane


class Lane:
    """One worker thread and its queue, ordered by deadline (arrival + cost x SECONDS_PER_UNIT)."""

    def __init__(self, name: str):
        self.queue: list[tuple[float, int, Future, Callable[..., Any], tuple]] = []
        self.ready = threading.Condition()
        self.order = itertools.count()  # equal deadlines: first come, first served
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def submit(self, cost: float, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self.ready:
            deadline = time.monotonic() + cost * SECONDS_PER_UNIT
            heapq.heappush(self.queue, (deadline, next(self.order), future, fn, args))
            self.ready.notify()
        return future

    def _work(self) -> None:
        while True:
            with self.ready:
                while not self.queue:
                    self.ready.wait()
                _, _, future, fn, args = heapq.heappop(self.queue)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # the caller sees it (a model's bug: a 500 naming a logged id)
                future.set_exception(e)


class Lanes:
    """A checkpoint's two lanes: requests of cost up to SHORT in the short one, the others in the long one."""

    def __init__(self, name: str):
        self.long, self.short = Lane(name), Lane(f"{name}-short")

    def submit(self, cost: float, fn: Callable[..., Any], *args: Any) -> Future:
        """fn(*args, short) in its lane, short = whether that is the short lane."""
        short = cost <= SHORT
        return (self.short if short else self.long).submit(cost, fn, *args, short)
