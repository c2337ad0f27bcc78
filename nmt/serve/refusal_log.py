"""uvicorn's warning for a request refused before the app, at most once a minute (nmt/serve/connections.py).

    protocol.logger = RefusalLog(protocol.logger, counts)   # counts: one RefusalCounts per server

uvicorn logs "Invalid HTTP request received." for every request it cannot read (malformed, a head over the
limit, a body in too many chunks), and nmt-serve answers each in JSON besides. Four clients sending bodies in
1-byte chunks made some 20 such requests a second, and writing a line for each cost the event loop more than
refusing them: on a busy machine every write let the model and drawing threads take the interpreter lock, and
the loop waited for it back. So the first refusal is logged at once and later ones at most every LOG_EVERY
seconds, with how many there were since; every other message goes through unchanged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

REFUSED = "Invalid HTTP request received."  # uvicorn's message (uvicorn.protocols.http.h11_impl)
LOG_EVERY = 60.0  # seconds between log lines about refused requests


@dataclass
class RefusalCounts:
    """Refused requests not yet logged, and when the last line was written (one per server)."""

    unlogged: int = 0
    logged_at: float | None = None


class RefusalLog(logging.LoggerAdapter):
    """A connection's logger: REFUSED at most every LOG_EVERY seconds, with a count; everything else as is."""

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter, counts: RefusalCounts):
        super().__init__(logger, {})
        self.counts = counts

    @property
    def level(self) -> int:  # uvicorn reads its logger's level
        return self.logger.level

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg != REFUSED:
            self.logger.warning(msg, *args, **kwargs)
            return
        c, now = self.counts, time.monotonic()
        c.unlogged += 1
        if c.logged_at is not None and now - c.logged_at < LOG_EVERY:
            return
        more = f" ({c.unlogged} such requests since the last line)" if c.logged_at is not None else ""
        self.logger.warning("%s Answered in JSON%s; later ones are counted, one line a minute", REFUSED, more)
        c.unlogged, c.logged_at = 0, now
