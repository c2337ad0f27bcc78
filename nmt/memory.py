"""Process-wide CPU memory settings that keep a long training run's resident memory flat.

Training batches come in many shapes (exact-length source buckets, varying target lengths), so every
step allocates and frees tensors of sizes the last step never used. With glibc's defaults, and with
oneDNN caching a compiled kernel ("primitive") for each new matmul shape, a 12-minute run on the
multi30k_deen preset grew to over 4 GiB resident while only ~0.9 GiB was in use: the heap fragmented
around long-lived allocations (README, "Performance" names the measurements). Three settings bound it:

- THP_MEM_ALLOC_ENABLE=1: torch gives tensors of 2 MiB and more transparent huge pages (fewer page faults
  and TLB misses when large tensors are allocated afresh);
- ONEDNN_PRIMITIVE_CACHE_CAPACITY=256 (oneDNN's default is 1024): fewer cached bf16 kernels, each of
  which pins memory in the middle of the heap;
- glibc's mmap threshold fixed at 4 MiB (glibc otherwise raises it up to 32 MiB as the program runs):
  tensors above it are mapped on their own and returned to the system when freed.

The first two are read by torch and oneDNN when they start, so `tune_allocator()` must run before torch
is imported; the command-line entry points call it first (nmt/cli/__init__.py). Each setting is a
default: a variable already in the environment wins (`MALLOC_MMAP_THRESHOLD_` for the third), and
`NMT_TUNE_ALLOCATOR=0` (or off, false, no) leaves all three alone. This module must not import torch.
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV_DEFAULTS = {"THP_MEM_ALLOC_ENABLE": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256"}
MMAP_THRESHOLD = 4 * 1024 * 1024  # bytes
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h

_applied: dict[str, str] = {}  # what tune_allocator() set, so child processes can be given the user's environment
_tuned = False


def tune_allocator() -> dict[str, str]:
    """Apply the settings above (once per process); the environment variables and malloc options it set."""
    global _tuned
    if _tuned or os.environ.get("NMT_TUNE_ALLOCATOR", "1").strip().lower() in ("0", "false", "no", "off"):
        return dict(_applied)
    _tuned = True
    torch_loaded = "torch" in sys.modules
    for key, value in ENV_DEFAULTS.items():
        if key not in os.environ and not torch_loaded:  # too late once torch has started: say nothing
            os.environ[key] = value
            _applied[key] = value
    libc = glibc()
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ and libc is not None:
        if libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1:
            _applied["malloc mmap threshold"] = str(MMAP_THRESHOLD)
    return dict(_applied)


def untuned_environment() -> dict[str, str]:
    """os.environ without the variables tune_allocator() added: for running other programs (the peers of
    scripts/benchmark.py) exactly as the user's shell would."""
    return {k: v for k, v in os.environ.items() if not (k in _applied and _applied[k] == v)}


def glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (Linux), else None."""
    try:
        if sys.platform != "linux" or not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        return ctypes.CDLL("libc.so.6")
    except (OSError, ValueError):  # not glibc (musl has no such confstr name)
        return None
