"""User-facing errors.

Anything the user can fix (a bad file, a wrong key, a broken checkpoint) is raised as an
`NMTError` whose message names the file (and line) and says what to do. The command-line entry
points print such an error as one line and exit with status 2, without a traceback.
"""

from __future__ import annotations


class NMTError(Exception):
    """An error caused by the user's input, with a message that says how to fix it."""


class DataError(NMTError):
    """A corpus file is missing, malformed or inconsistent."""


class CheckpointError(NMTError):
    """A checkpoint is missing, truncated, foreign or incompatible."""


class ConfigError(NMTError):
    """A configuration value is unknown or of the wrong type."""
