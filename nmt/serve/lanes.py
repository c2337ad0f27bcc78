"""Each checkpoint's translations, one at a time in its own thread, the earliest deadline first (nmt/serve/app.py).

    lane = Lane("nmt-model0")
    future = lane.submit(len(text) * beam, model.translate, text, beam, max_pieces)   # a concurrent.futures.Future

A checkpoint translates one request at a time. Served in order of arrival, a three-word request waited behind
every long one before it: six clients asking for 150-word pages kept each checkpoint busy for seconds. So each
request gets a deadline, its arrival plus SECONDS_PER_UNIT for each unit of its cost (the characters of its text
times its beam), and the lane runs the earliest deadline first: a short request overtakes the long ones waiting,
and a long one is overtaken only by requests that came less than its own allowance after it (10 s for 1,000
characters, greedy), so none waits for ever. A translation in progress is never interrupted.
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
