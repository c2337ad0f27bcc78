"""nmt/memory.py: the entry points' CPU memory settings are defaults that the user's environment overrides.

Each case runs a fresh interpreter, because the settings only apply before torch is loaded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nmt import memory
from nmt.errors import ConfigError
from nmt.memory import ENV_DEFAULTS, MMAP_THRESHOLD, SCRIPTS, TRIM_THRESHOLD, VARIABLES, find_malloc, started_as_command

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
    drop = (*VARIABLES, "THP_MEM_ALLOC_ENABLE", "LD_PRELOAD", "NMT_MALLOC_PRELOADED")
    return {k: v for k, v in os.environ.items() if k not in drop}


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


PROBE_HEAD = """
import ctypes, json
import nmt.cli
from nmt.memory import glibc, heap_bytes, tune_for_decoding, tune_for_fp32_training

if heap_bytes() is None:  # glibc < 2.33
    print(json.dumps({"skip": "glibc has no mallinfo2"}))
    raise SystemExit
libc = glibc()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
"""
DECODING_PROBE = (
    PROBE_HEAD
    + """
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
)


def decoding_probe(probe: str = DECODING_PROBE, **env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env={**clean_env(), **env}
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


FP32_PROBE = (
    PROBE_HEAD
    + """

def mapped_alone(size=24 << 20):  # is a new block of `size` bytes (kept: the heap has no room) mapped alone?
    before = heap_bytes()[2]
    libc.malloc(size)
    return heap_bytes()[2] - before >= size

training = mapped_alone()
applied = tune_for_fp32_training()
print(json.dumps({"training": training, "fp32": mapped_alone(), "applied": applied}))
"""
)


@glibc_only
def test_fp32_training_maps_blocks_of_16_mib_and_more_on_their_own():
    out = decoding_probe(FP32_PROBE)
    assert not out["training"] and out["fp32"]  # a 24 MiB block grows the heap at first, then is mapped alone
    assert out["applied"]["fp32 training: malloc mmap threshold"] == str(16 << 20)


PRELOAD_PROBE = """
import json, os
from nmt.memory import glibc_malloc, heap_bytes, preload_malloc, untuned_environment
malloc = preload_malloc()  # starts this interpreter again where it preloads a library
child = untuned_environment()
print(json.dumps({"malloc": malloc, "preload": os.environ.get("LD_PRELOAD"), "glibc_malloc": glibc_malloc(),
                  "heap": heap_bytes() is not None,
                  "child": [child.get("LD_PRELOAD"), child.get("NMT_MALLOC_PRELOADED")]}))
"""


def preload_probe(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE], capture_output=True, text=True, timeout=120, env={**clean_env(), **env}
    )


def preload_out(**env: str) -> dict:
    proc = preload_probe(**env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def the_c_library() -> Path:
    """The path of the glibc this interpreter runs on: preloading it again changes nothing, so the tests can
    go through preload_malloc's restart on any Linux machine, with or without tcmalloc."""
    with open("/proc/self/maps") as maps:
        return Path(next(line.split()[-1] for line in maps if "/libc.so" in line or "/libc-" in line))


@glibc_only
def test_a_malloc_library_named_by_path_is_preloaded_and_children_get_the_users_environment(tmp_path):
    link = tmp_path / "libmymalloc.so"
    link.symlink_to(the_c_library())
    out = preload_out(NMT_MALLOC=str(link))
    assert out["preload"] == str(link.resolve()) == out["malloc"]  # restarted once with it (a loop would hang)
    assert out["child"] == [None, None]  # the peers of scripts/benchmark.py start as the user's shell would


@glibc_only
def test_glibc_the_switch_and_the_users_own_preload_are_left_alone(tmp_path):
    link = tmp_path / "libmymalloc.so"
    link.symlink_to(the_c_library())
    assert preload_out(NMT_MALLOC="glibc")["preload"] is None
    assert preload_out(NMT_MALLOC=str(link), NMT_TUNE_ALLOCATOR="0")["preload"] is None
    own = preload_out(NMT_MALLOC=str(link), LD_PRELOAD=str(the_c_library()))
    assert own["preload"] == own["malloc"] == str(the_c_library()) == own["child"][0]  # the user's, passed on


@glibc_only
def test_auto_runs_under_tcmalloc_where_the_system_has_it():
    out = preload_out()
    tcmalloc = find_malloc("tcmalloc")
    if tcmalloc is None:  # the machine has none: glibc, as before
        assert out["malloc"] == "glibc" and out["preload"] is None and out["glibc_malloc"]
    else:
        assert out["malloc"] == "tcmalloc" and out["preload"] == str(tcmalloc)
        assert not out["glibc_malloc"] and out["heap"]  # heap figures from tcmalloc's own counters


@pytest.mark.skipif(sys.platform != "linux", reason="the malloc is chosen on Linux only")
@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("bogus", "is not a choice: use auto, tcmalloc, jemalloc, glibc"),
        ("/no/such/libmalloc.so", "no such file"),
        ("jemalloc", "install it (apt install libjemalloc2"),
        ("tcmalloc", "install it (apt install libtcmalloc-minimal4"),
    ],
)
def test_an_unknown_or_missing_malloc_is_a_clear_error(name, fix, monkeypatch, tmp_path):
    for variable in ("LD_PRELOAD", "NMT_MALLOC_PRELOADED", "NMT_TUNE_ALLOCATOR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NMT_MALLOC", name)
    monkeypatch.setattr(memory, "library_dirs", lambda: [tmp_path])  # installed nowhere, on any machine
    with pytest.raises(ConfigError, match=re.escape(fix)):
        memory.preload_malloc()  # raises before it could start this process again


def test_a_command_says_so_in_one_line():
    env = {**clean_env(), "NMT_MALLOC": "bogus"}
    proc = subprocess.run(
        [sys.executable, "-m", "nmt.cli.translate", "--help"], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr == "nmt: error: NMT_MALLOC='bogus' is not a choice: use auto, tcmalloc, jemalloc, glibc "
        "or the path of a malloc library (or unset it)\n"
    )


def test_the_commands_and_scripts_are_told_from_other_programs():
    python = sys.executable
    assert started_as_command([python, "/venv/bin/nmt-train", "attention=luong"])
    assert started_as_command([python, "-m", "nmt.cli.translate", "ckpt.pt"])
    assert started_as_command([python, "-u", str(SCRIPTS / "benchmark.py"), "--peer", "opennmt"])
    assert not started_as_command([python, "-m", "pytest", "-q"])
    assert not started_as_command([python, "-c", "import nmt.cli"])
    assert not started_as_command([python, "/home/me/train_my_model.py"])
    assert not started_as_command([python, "-X", "importtime", "-c", "import nmt.cli"])
    assert not started_as_command([python])


def test_find_malloc_takes_the_first_library_in_order(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    (first / "libtcmalloc.so.4").touch()
    assert find_malloc("tcmalloc", [first, second]) == first / "libtcmalloc.so.4"
    (second / "libtcmalloc_minimal.so.4").touch()  # the minimal library comes first, in whichever directory
    assert find_malloc("tcmalloc", [first, second]) == second / "libtcmalloc_minimal.so.4"
    assert find_malloc("jemalloc", [first, second]) is None
