"""Ctrl-C at any instant of a command: one line, exit status 130, no traceback, nothing half-written.

`install()` runs first in every command (nmt/cli/__init__.py, before torch or Hydra are imported); from then on
SIGINT is handled by this module, by phase:

    loading   the command's modules are imported and nothing is written yet: the process ends at once
    running   `with running("nmt-train"):` around the command's body: the first Ctrl-C raises KeyboardInterrupt,
              so that every `finally`, atomic write (nmt.atomic) and cleanup (`on_interrupt`: a run directory
              made for nothing, nmt.cli.rerun.forget_unused) runs; the block then prints one line and exits 130.
              nmt-train's trainer handles SIGINT itself while it trains (finish the step, save, stop).
    ending    after the body, its work done: Ctrl-C is ignored while Python exits (its own exit drops every handler,
              and a signal then would end the process by the signal)

A second Ctrl-C while the first unwinds ends the process at once. A KeyboardInterrupt raised where Python cannot
pass it on (a __del__, a weakref callback: "Exception ignored in ...") is not printed but delivered again a moment
later, from another thread, so that it is raised in the command's own code.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from nmt.cli.command import command_name  # noqa: F401  (the commands' name, as before)

STATUS = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C
_state = {"phase": "loading", "prog": "nmt", "raised": False, "again": False, "installed": False}
_cleanups: list[Callable[[], None]] = []


def install(prog: str) -> None:
    """Handle SIGINT as the module says, from now on (the command is loading)."""
    _state.update(prog=prog, installed=True)
    signal.signal(signal.SIGINT, _handler)
    previous = sys.unraisablehook

    def unraisable(hook_args) -> None:
        if isinstance(hook_args.exc_value, KeyboardInterrupt) and _state["phase"] == "running":
            _state["again"] = True  # not a second Ctrl-C: the first one, swallowed; delivered again from another
            threading.Timer(0.01, _thread.interrupt_main).start()  # thread, so that it is not raised in this hook
            return
        if not isinstance(hook_args.exc_value, KeyboardInterrupt):
            previous(hook_args)

    sys.unraisablehook = unraisable


def on_interrupt(cleanup: Callable[[], None]) -> None:
    """Call `cleanup` when the command is interrupted (before it exits 130)."""
    _cleanups.append(cleanup)


@contextmanager
def running(prog: str) -> Iterator[None]:
    """The command's body: Ctrl-C unwinds it (KeyboardInterrupt), then one line and exit status 130."""
    _state.update(phase="running", prog=prog)
    try:
        yield
    except Exception:
        if not _state["raised"]:
            raise
        _interrupted()  # a library's cleanup failed on the interrupt it was unwinding (state left half-changed)
    except KeyboardInterrupt:
        _interrupted()
    finally:
        _state["phase"] = "ending"
        if _state["installed"]:  # the work is done: Python's own exit (which drops handlers) is not interrupted
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _interrupted() -> None:
    """Run the cleanups, then one line and exit 130."""
    _state["phase"] = "ending"
    for cleanup in _cleanups:
        try:
            cleanup()
        except Exception:  # a cleanup that fails leaves its folder; the interrupt is what to report
            pass
    _say_and_end(exit_now=False)


def _handler(signum, frame) -> None:
    if _state["phase"] == "running" and (not _state["raised"] or _state["again"]):
        _state["raised"], _state["again"] = True, False
        raise KeyboardInterrupt
    _say_and_end(exit_now=True)


def _say_and_end(exit_now: bool) -> None:
    """One line on stderr; exit 130, at once (`exit_now`: os._exit, from a signal handler) or by SystemExit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a stream closed, or interrupted in the middle of a write
            pass
    try:
        os.write(2, f"\n{_state['prog']}: interrupted\n".encode())
    except OSError:
        pass
    if exit_now:
        os._exit(STATUS)
    sys.exit(STATUS)
