"""nmt/memory.py: the entry points' CPU memory settings are defaults that the user's environment overrides.

Each case runs a fresh interpreter, because the settings only apply before torch is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nmt.memory import ENV_DEFAULTS, MMAP_THRESHOLD, TRIM_THRESHOLD, VARIABLES

PROBE = """
import json, os
import nmt.cli  # what every entry point imports first
from nmt.memory import ENV_DEFAULTS, _applied, untuned_environment
import torch
torch.ones(1024, 1024).sum()  # torch starts with the settings in place
keys = tuple(ENV_DEFAULTS)
print(json.dumps({"applied": _applied, "env": {k: os.environ.get(k) for k in keys},
                  "thp": os.environ.get("THP_MEM_ALLOC_ENABLE"),
                  "child": {k: untuned_environment().get(k) for k in keys}}))
"""


def clean_env() -> dict[str, str]:
    """This environment without the variables the settings read, nor torch's huge-page switch, which they
    leave alone (a user's own would change the outcome)."""
    return {k: v for k, v in os.environ.items() if k not in (*VARIABLES, "THP_MEM_ALLOC_ENABLE")}


def probe(**env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env={**clean_env(), **env}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_entry_points_set_the_defaults_and_children_get_the_users_environment():
    out = probe()
    assert out["env"] == ENV_DEFAULTS
    assert out["child"] == {k: None for k in ENV_DEFAULTS}  # peers and other programs start untouched
    assert out["thp"] is None  # torch's huge-page tensors stay off: they stalled decoding (nmt/memory.py)
    if sys.platform == "linux" and os.confstr("CS_GNU_LIBC_VERSION"):
        assert out["applied"]["malloc mmap threshold"] == str(MMAP_THRESHOLD)
        assert out["applied"]["malloc trim threshold"] == str(TRIM_THRESHOLD)


def test_the_users_values_win():
    out = probe(ONEDNN_PRIMITIVE_CACHE_CAPACITY="64", MALLOC_MMAP_THRESHOLD_="131072")
    assert out["env"] == {**ENV_DEFAULTS, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
    # mmap threshold and oneDNN's cache: the user's variables
    assert set(out["applied"]) == {*ENV_DEFAULTS, "malloc trim threshold"} - {"ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    assert out["child"]["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"  # the user's own value is passed on


@pytest.mark.parametrize("off", ["0", "off", "False"])
def test_the_switch_leaves_everything_alone(off):
    out = probe(NMT_TUNE_ALLOCATOR=off)
    assert out["applied"] == {} and out["env"] == {k: None for k in ENV_DEFAULTS}


DECODING_PROBE = """
import ctypes, json
import nmt.cli
from nmt.memory import glibc, heap_bytes, tune_for_decoding

if heap_bytes() is None:  # glibc < 2.33
    print(json.dumps({"skip": "glibc has no mallinfo2"}))
    raise SystemExit
libc = glibc()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def mapped_alone(size=64 << 20):  # is a block of `size` bytes mapped on its own (not taken from the heap)?
    before = heap_bytes()[2]
    block = libc.malloc(size)
    alone = heap_bytes()[2] - before >= size
    libc.free(block)
    return alone

training = mapped_alone()
applied = tune_for_decoding()
print(json.dumps({"training": training, "decoding": mapped_alone(), "applied": applied}))
"""


def decoding_probe(**env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", DECODING_PROBE], capture_output=True, text=True, timeout=120, env={**clean_env(), **env}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


glibc_only = pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"),
    reason="the allocator settings are glibc's",
)


@glibc_only
def test_decoding_takes_large_blocks_from_the_heap():
    # training maps a 64 MiB block on its own (returned when freed); the decoding commands reuse heap pages
    out = decoding_probe()
    assert out["training"] and not out["decoding"]
    assert set(out["applied"]) == {"decoding: malloc mmap threshold", "decoding: malloc trim threshold"}


@glibc_only
def test_decoding_settings_leave_the_users_choice_alone():
    out = decoding_probe(MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    assert out["training"] and out["decoding"]  # the user's 1 MiB threshold still maps the block on its own
    assert set(out["applied"]) == {"decoding: malloc trim threshold"}
    off = decoding_probe(NMT_TUNE_ALLOCATOR="0")
    assert off["applied"] == {}
