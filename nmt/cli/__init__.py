"""Command-line entry points: the only modules that import Hydra.

Importing this package first hands Ctrl-C to nmt.cli.interrupt when the process is one of the commands (one line
and exit status 130 at any instant, never a traceback), then tunes the process's CPU memory settings
(nmt/memory.py), which only take effect before torch is loaded: every entry point is a module in this package, so
that comes first. When the process is one of the commands (not a library user, nor the tests), it first starts
again under tcmalloc where the system has it (nmt.memory.preload_malloc)."""

from nmt.cli.interrupt import command_name, install
from nmt.errors import command_errors
from nmt.memory import preload_malloc, started_as_command, tune_allocator

if command_name() not in (None, "nmt-serve"):  # nmt-serve's server handles signals itself
    install(command_name())
if started_as_command():
    with command_errors("nmt"):  # a wrong NMT_MALLOC: one line, exit status 2
        preload_malloc()
tune_allocator()
