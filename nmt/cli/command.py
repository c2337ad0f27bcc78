"""Which nmt command this process is, read from the interpreter's own command line: the first thing a command
needs to know (nmt/cli/__init__.py asks before anything else is imported), so this module imports only what
Python has loaded before any program runs (os, sys)."""

from __future__ import annotations

import os
import sys


def command_name(argv: list[str] | None = None) -> str | None:
    """The command this process is, from the interpreter's own command line: "nmt-train" for the console script
    or `python -m nmt.cli.train`; None for anything else (a library user, the tests, a script)."""
    args = iter((list(getattr(sys, "orig_argv", [])) if argv is None else argv)[1:])
    for arg in args:  # the interpreter's options, up to the program (as nmt.memory.started_as_command)
        if arg in ("-m", "-c"):
            module = next(args, "") if arg == "-m" else ""
            return f"nmt-{module.rpartition('.')[2]}" if module.startswith("nmt.cli.") else None
        if arg in ("-X", "-W", "--check-hash-based-pycs"):
            next(args, None)
        elif not arg.startswith("-"):
            name = os.path.basename(arg)
            return name if name.startswith("nmt-") else None
    return None
