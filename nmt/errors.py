"""User-facing errors.

Anything the user can fix (a bad file, a wrong key, a broken checkpoint) is raised as an
`NMTError` whose message names the file (and line) and says what to do. The command-line entry
points print such an error as one line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class NMTError(Exception):
    """An error caused by the user's input, with a message that says how to fix it."""


class DataError(NMTError):
    """A corpus file is missing, malformed or inconsistent."""


class CheckpointError(NMTError):
    """A checkpoint is missing, truncated, foreign or incompatible."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint whose bytes are damaged: cut off, or not those its digest was computed from.
    `what` is "<path>: <the problem>", the message without the fix."""

    def __init__(self, what: str, fix: str):
        super().__init__(f"{what}; {fix}")
        self.what = what


class RunDirError(NMTError):
    """A run directory that another trainer holds, or that cannot be written."""


class OutputError(NMTError):
    """An output file (nmt-evaluate's report, hypotheses, figures) that cannot be written. `result`: what was
    computed before the write failed (the scores), for the command to print all the same."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result


class ConfigError(NMTError, ValueError):
    """A configuration value is unknown or of the wrong type (a ValueError too, for library callers)."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (at most 160 characters), else its type's name: for messages
    that quote a library's error in one line."""
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else type(e).__name__


def write_failure(
    e: BaseException, elsewhere: str = "choose another run directory with hydra.run.dir=..."
) -> tuple[str, str]:
    """(why a write failed, what to do): the OSError behind `e` ("No space left on device", "Read-only file
    system", ...) and the fix for it (`elsewhere`: where else to write), else `e`'s first line."""
    seen: BaseException | None = e
    while seen is not None and not isinstance(seen, OSError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return first_line(e), f"free disk space or {elsewhere}"
    reason = seen.strerror or str(seen)
    if seen.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return reason, f"make it writable, or {elsewhere}"
    return reason, f"free disk space or {elsewhere}"


@contextmanager
def command_errors(prog: str) -> Iterator[None]:
    """The body of a command without Hydra (nmt-translate, nmt-serve): an NMTError becomes one line
    `prog: error: ...` and exit status 2 (NMT_DEBUG=1 shows the traceback); Ctrl-C is `prog: interrupted`, exit 130."""
    try:
        yield
    except NMTError as e:
        if os.environ.get("NMT_DEBUG"):
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
