"""nmt/memory.py: the entry points' CPU memory settings are defaults that the user's environment overrides.

Each case runs a fresh interpreter, because the settings only apply before torch is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nmt.memory import ENV_DEFAULTS

PROBE = """
import json, os
import nmt.cli  # what every entry point imports first
from nmt.memory import _applied, untuned_environment
import torch
torch.ones(1024, 1024).sum()  # torch starts with the settings in place
keys = ("THP_MEM_ALLOC_ENABLE", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")
print(json.dumps({"applied": _applied, "env": {k: os.environ.get(k) for k in keys},
                  "child": {k: untuned_environment().get(k) for k in keys}}))
"""


def probe(**env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in (*ENV_DEFAULTS, "NMT_TUNE_ALLOCATOR")}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env={**base, **env}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_entry_points_set_the_defaults_and_children_get_the_users_environment():
    out = probe()
    assert out["env"] == ENV_DEFAULTS
    assert out["child"] == {k: None for k in ENV_DEFAULTS}  # peers and other programs start untouched
    if sys.platform == "linux" and os.confstr("CS_GNU_LIBC_VERSION"):
        assert out["applied"]["malloc mmap threshold"] == str(4 * 1024 * 1024)


def test_the_users_values_win():
    out = probe(ONEDNN_PRIMITIVE_CACHE_CAPACITY="1024", MALLOC_MMAP_THRESHOLD_="131072")
    assert out["env"] == {"THP_MEM_ALLOC_ENABLE": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}
    assert set(out["applied"]) == {"THP_MEM_ALLOC_ENABLE"}  # the glibc setting was left to the user's variable
    assert out["child"]["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"  # the user's own value is passed on


@pytest.mark.parametrize("off", ["0", "off", "False"])
def test_the_switch_leaves_everything_alone(off):
    out = probe(NMT_TUNE_ALLOCATOR=off)
    assert out["applied"] == {} and out["env"] == {k: None for k in ENV_DEFAULTS}
