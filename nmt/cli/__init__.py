"""Command-line entry points: the only modules that import Hydra.

Importing this package first hands Ctrl-C to nmt.cli.interrupt when the process is one of the commands (one line
and exit status 130 at any instant, never a traceback; while that module itself loads, the default action: the
process ends by the signal, without a word, having written nothing), then tunes the process's CPU memory settings
(nmt/memory.py), which only take effect before torch is loaded: every entry point is a module in this package, so
that comes first. When the process is one of the commands (not a library user, nor the tests), it first starts
again under tcmalloc where the system has it (nmt.memory.preload_malloc)."""

import signal as _signal

from nmt.cli.command import command_name

_command = command_name()
_handled = _command not in (None, "nmt-serve")  # nmt-serve's server handles signals itself
if _handled:  # until nmt.cli.interrupt takes over (its imports take a few ms): Ctrl-C ends it without a word
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)

from nmt.cli.interrupt import install  # noqa: E402  (after the handler above)
from nmt.errors import command_errors  # noqa: E402
from nmt.memory import preload_malloc, started_as_command, tune_allocator  # noqa: E402

if _handled:
    install(_command)
if started_as_command():
    with command_errors("nmt"):  # a wrong NMT_MALLOC: one line, exit status 2
        preload_malloc()
tune_allocator()
