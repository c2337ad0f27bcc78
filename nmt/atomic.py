"""Writing a file so that readers only ever see the old version or the whole new one.

    with atomic_path(cache / "encoded.pt") as tmp:
        torch.save(blob, tmp)                    # written to .encoded.pt.tmp<pid>, renamed when the block ends

A failure inside the block (or a kill) leaves the previous file untouched; a failed block removes its
temporary file, a killed process leaves `.<name>.tmp<pid>`, which nmt.checkpoint cleans up later. The
process id in the name keeps parallel jobs filling one cache from writing into the same temporary file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def temporary_name(path: Path) -> Path:
    """`.<name>.tmp<pid>` next to `path`."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write `path` through; renamed onto `path` when the block succeeds, removed when
    it raises. (Close and, where it matters, fsync the file inside the block.)"""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
