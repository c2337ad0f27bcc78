"""Process-wide CPU memory settings: resident memory that stays bounded in training, speed in decoding.

Training batches come in many shapes (exact-length source buckets, varying target lengths), so every step
allocates and frees tensors of sizes the last step never used, and oneDNN compiles a kernel for each new matmul
shape. With glibc's and oneDNN's defaults the heap fragments around long-lived allocations and kernels are
compiled again and again. The settings (docs/performance.md, "Memory", lists them for users):

- ONEDNN_PRIMITIVE_CACHE_CAPACITY=4096: room for every compiled bf16 kernel an epoch meets, so that a kernel
  evicted by other shapes is not compiled again when its batch comes back;
- LRU_CACHE_CAPACITY=128: ideep's own kernel cache (inside torch), which otherwise keeps a copy per shape on
  top of oneDNN's; 128 holds every shape one batch uses (0 crashes torch: never set it to 0);
- glibc's mmap threshold fixed at 32 MiB and its trim threshold at 64 MiB (glibc otherwise moves both as the
  program runs): large tensors that no free block can hold are mapped on their own and returned when freed,
  smaller ones reuse the heap's pages. Lower keeps less memory but every tensor above it faults its pages in
  anew; higher keeps fp32 logits in a heap that fragments. Training in fp32 on a CPU lowers the mmap threshold
  to 16 MiB (`tune_for_fp32_training`, called by the Trainer);
- not set: THP_MEM_ALLOC_ENABLE (torch's huge pages), because where the kernel compacts memory on request
  (`defrag` = madvise) a fresh tensor can wait tens of milliseconds for its pages. A user's value still
  reaches torch.

The malloc itself: on Linux the commands run under tcmalloc (gperftools) where the system has it
(`preload_malloc()`: the process starts again with it in LD_PRELOAD, before torch is loaded): it reuses blocks
by size class and returns free spans where glibc's heap keeps the pages of freed tensors of many sizes.
NMT_MALLOC picks: auto (tcmalloc if found, else glibc), tcmalloc, jemalloc or glibc. Without tcmalloc nothing
changes.

The two cache sizes are read by oneDNN and ideep when they start, so `tune_allocator()` must run before torch
is imported; the command-line entry points call it first (nmt/cli/__init__.py). Processes that only
decode then call `tune_for_decoding()`, which raises both glibc thresholds further. Each setting is a
default: a variable already in the environment wins (`MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_`
for the glibc ones), and `NMT_TUNE_ALLOCATOR=0` (or off, false, no) leaves everything alone. This module
must not import torch.
"""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
from pathlib import Path

from nmt.errors import ConfigError

ENV_DEFAULTS = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "4096", "LRU_CACHE_CAPACITY": "128"}
# every variable the settings read (a value already in the environment wins; the switch turns them all off)
VARIABLES = (*ENV_DEFAULTS, "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "NMT_TUNE_ALLOCATOR", "NMT_MALLOC")
MIB = 1024 * 1024
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 * MIB, 64 * MIB  # bytes, training (and every entry point until it decodes)
FP32_MMAP_THRESHOLD = 16 * MIB  # bytes, training in fp32 on a CPU (tune_for_fp32_training)
DECODE_MMAP_THRESHOLD, DECODE_TRIM_THRESHOLD = 256 * MIB, 1024 * MIB  # bytes, processes that only decode
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers in glibc's malloc.h

_applied: dict[str, str] = {}  # what tune_allocator() set, so child processes can be given the user's environment
_tuned = False


def tune_allocator() -> dict[str, str]:
    """Apply the settings above (once per process); the environment variables and malloc options it set."""
    global _tuned
    if _tuned or _switched_off():
        return dict(_applied)
    _tuned = True
    torch_loaded = "torch" in sys.modules
    for key, value in ENV_DEFAULTS.items():
        if key not in os.environ and not torch_loaded:  # too late once torch has started: say nothing
            os.environ[key] = value
            _applied[key] = value
    _set_malloc("", MMAP_THRESHOLD, TRIM_THRESHOLD)
    return dict(_applied)


def tune_for_decoding() -> dict[str, str]:
    """Decoding's glibc settings, for processes that only decode (nmt-translate, nmt-evaluate, nmt-serve):
    the mmap threshold at DECODE_MMAP_THRESHOLD and the trim threshold at DECODE_TRIM_THRESHOLD.

    Search allocates tensors of tens of megabytes at every step (gates and logits of a whole batch of
    beams); mapped on their own, each is new memory whose pages fault in as they are first written, which
    cost about a third of beam-5 decoding time on the machine measured (README, "Performance"). From the
    heap they reuse the pages of the step before. A decoding process is short or holds one model, so the
    training-time concern (a heap fragmenting over hours) does not apply. Can be called at any time; the
    same variables and switch as tune_allocator's leave it alone. Returns what it set."""
    if _switched_off():
        return {}
    return _set_malloc("decoding: ", DECODE_MMAP_THRESHOLD, DECODE_TRIM_THRESHOLD)


def tune_for_fp32_training() -> dict[str, str]:
    """glibc's mmap threshold at FP32_MMAP_THRESHOLD, for a process that trains in fp32 on a CPU (the Trainer
    calls it; the same variables and switch as tune_allocator's leave it alone). Returns what it set.

    In fp32 the heap fragmented as a run went on: free blocks of many sizes between blocks in use, and the heap
    growing whenever a step's larger tensors fit none of them. glibc maps a block on its own only when no free
    block of the heap can hold it, so at 16 MiB a step's larger tensors (the inputs to the LSTM gates, the
    gradients of the embeddings and the output layer) still reuse free blocks where one fits and are mapped,
    instead of growing the heap, where none does; lower thresholds cost speed in whole runs.
    Under bf16 autocast, whose speed was measured at 32 MiB, training keeps tune_allocator's settings."""
    if _switched_off():
        return {}
    return _set_malloc("fp32 training: ", FP32_MMAP_THRESHOLD, TRIM_THRESHOLD)


def _set_malloc(prefix: str, mmap_threshold: int, trim_threshold: int) -> dict[str, str]:
    """glibc's two thresholds through mallopt, each unless its environment variable is set; what it set."""
    applied: dict[str, str] = {}
    libc = glibc()
    if libc is None or not glibc_malloc():
        return applied
    for variable, name, param, value in (
        ("MALLOC_MMAP_THRESHOLD_", "malloc mmap threshold", _M_MMAP_THRESHOLD, mmap_threshold),
        ("MALLOC_TRIM_THRESHOLD_", "malloc trim threshold", _M_TRIM_THRESHOLD, trim_threshold),
    ):
        if variable not in os.environ and libc.mallopt(param, value) == 1:
            applied[prefix + name] = _applied[prefix + name] = str(value)
    return applied


def _switched_off() -> bool:
    return os.environ.get("NMT_TUNE_ALLOCATOR", "1").strip().lower() in ("0", "false", "no", "off")


def untuned_environment() -> dict[str, str]:
    """os.environ without the variables tune_allocator() and preload_malloc() added: for running other programs
    (the peers of scripts/benchmark.py) exactly as the user's shell would."""
    return {k: v for k, v in os.environ.items() if not (k in _applied and _applied[k] == v)}


# NMT_MALLOC's choices other than glibc: the shared libraries each is found as, in order of preference
MALLOC_LIBRARIES = {
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"),
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
}
MALLOC_PACKAGES = {  # how to get each, said when NMT_MALLOC names one that is not installed
    "tcmalloc": "apt install libtcmalloc-minimal4 (Debian, Ubuntu), dnf install gperftools-libs (Fedora) "
    "or conda install gperftools",
    "jemalloc": "apt install libjemalloc2 (Debian, Ubuntu), dnf install jemalloc (Fedora) or conda install jemalloc",
}
_PRELOADED = "NMT_MALLOC_PRELOADED"  # set with LD_PRELOAD when preload_malloc() restarts the process
COMMAND_PREFIX = "nmt-"  # the console scripts' names (pyproject.toml)


def malloc_choice() -> str:
    """NMT_MALLOC's value: auto (the default), glibc, tcmalloc, jemalloc, or the path of a malloc library;
    a ConfigError for anything else (the commands print it as one line and exit with status 2)."""
    raw = os.environ.get("NMT_MALLOC", "auto").strip()
    choice = raw.lower() or "auto"
    if "/" in raw:
        if not Path(raw).is_file():
            raise ConfigError(
                f"NMT_MALLOC={raw}: no such file; give the path of a malloc library (libtcmalloc_minimal.so.4, "
                "libjemalloc.so.2), or one of auto, tcmalloc, jemalloc, glibc, or unset it"
            )
        return raw
    if choice not in ("auto", "glibc", *MALLOC_LIBRARIES):
        raise ConfigError(
            f"NMT_MALLOC={raw!r} is not a choice: use auto, tcmalloc, jemalloc, glibc or the path of a "
            "malloc library (or unset it)"
        )
    return choice


def library_dirs() -> list[Path]:
    """Where shared libraries are looked for: this Python's prefix, conda's, then the system's directories."""
    prefixes = [sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX", "")]
    dirs = [Path(p, "lib") for p in prefixes if p]
    multiarch = sysconfig.get_config_var("MULTIARCH")  # x86_64-linux-gnu on Debian and Ubuntu
    for root in ("/usr/local/lib", "/usr/lib", "/lib"):
        dirs += [Path(root, multiarch)] if multiarch else []
        dirs.append(Path(root))
    return [*dict.fromkeys([*dirs, Path("/usr/lib64"), Path("/lib64")])]


def find_malloc(name: str, dirs: list[Path] | None = None) -> Path | None:
    """The first of MALLOC_LIBRARIES[name] found in `dirs` (default library_dirs()), or None."""
    for library in MALLOC_LIBRARIES[name]:
        for directory in library_dirs() if dirs is None else dirs:
            if (directory / library).is_file():
                return directory / library
    return None


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"  # the repository's benchmarks (a checkout)


def started_as_command(argv: list[str] | None = None) -> bool:
    """Whether this process is one of the console scripts (nmt-train, ...), `python -m nmt.cli.<name>` or
    one of the repository's scripts/ (which measure what the commands do), judged from the interpreter's own
    command line (sys.orig_argv), not from whatever imported nmt.cli (the tests, a library user)."""
    args = iter((list(getattr(sys, "orig_argv", [])) if argv is None else argv)[1:])
    for arg in args:  # the interpreter's options, up to the program
        if arg in ("-m", "-c"):
            return arg == "-m" and next(args, "").startswith("nmt.cli.")
        if arg in ("-X", "-W", "--check-hash-based-pycs"):
            next(args, None)  # the option's value
        elif not arg.startswith("-"):
            return Path(arg).name.startswith(COMMAND_PREFIX) or Path(arg).resolve().parent == SCRIPTS
    return False


def malloc_in_use() -> str:
    """The malloc this process runs under, as preload_malloc() chose it: tcmalloc, jemalloc, a library's path
    that LD_PRELOAD names, or glibc. For reports: peak memory depends on it (the module docstring)."""
    preload = os.environ.get("LD_PRELOAD", "").strip()
    if not preload:
        return "glibc"
    return next((name for name, libs in MALLOC_LIBRARIES.items() if Path(preload).name in libs), preload)


def preload_malloc() -> str:
    """Run this program under tcmalloc (or NMT_MALLOC's choice), starting it again with the library in
    LD_PRELOAD (os.execve: same process id, arguments and environment otherwise); returns the malloc in use
    (glibc, tcmalloc, jemalloc or a library's path).

    A malloc can only be chosen before the process starts, so this restarts it: call it first thing, before
    anything is printed or computed. glibc stays off Linux, with NMT_MALLOC=glibc or NMT_TUNE_ALLOCATOR=0,
    when the user has set LD_PRELOAD, and when NMT_MALLOC=auto finds no tcmalloc; NMT_MALLOC naming a
    library that is not installed raises a ConfigError that says how to install it."""
    choice = malloc_choice()
    preload = os.environ.get("LD_PRELOAD", "").strip()
    if os.environ.get(_PRELOADED):  # the second start: record what was set, for untuned_environment()
        if preload != os.environ[_PRELOADED]:
            return "glibc"  # something in between dropped it: do not start again
        _applied.update({"LD_PRELOAD": preload, _PRELOADED: preload})
        return next((name for name, libs in MALLOC_LIBRARIES.items() if Path(preload).name in libs), preload)
    if sys.platform != "linux" or _switched_off() or choice == "glibc" or preload:
        return preload or "glibc"
    if "/" in choice:
        found: Path | None = Path(choice).resolve()
    else:
        found = find_malloc("tcmalloc" if choice == "auto" else choice)  # auto: jemalloc trained slower
    if found is None:
        if choice != "auto":
            raise ConfigError(
                f"NMT_MALLOC={choice}: none of {', '.join(MALLOC_LIBRARIES[choice])} in "
                f"{', '.join(map(str, library_dirs()))}; install it ({MALLOC_PACKAGES[choice]}), give its "
                "path as NMT_MALLOC, or unset NMT_MALLOC"
            )
        return "glibc"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), {**os.environ, "LD_PRELOAD": str(found), _PRELOADED: str(found)})
    raise AssertionError("unreachable")  # pragma: no cover


def glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (Linux), else None."""
    try:
        if sys.platform != "linux" or not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        return ctypes.CDLL("libc.so.6")
    except (OSError, ValueError):  # not glibc (musl has no such confstr name)
        return None


def glibc_malloc() -> bool:
    """Whether this process's malloc is glibc's own (not tcmalloc or jemalloc put in front by LD_PRELOAD)."""
    libc = glibc()
    if libc is None:
        return False
    address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value  # what every library calls
    return address == ctypes.cast(libc.malloc, ctypes.c_void_p).value


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_bytes() -> tuple[int, int, int] | None:
    """The heap now: (bytes in use, bytes free but held, bytes in separately mapped blocks), from tcmalloc
    where it is the malloc (nothing mapped separately there), else glibc's; None where neither tells (glibc
    without mallinfo2, before 2.33; jemalloc)."""
    if (tcmalloc := _tcmalloc_heap()) is not None:
        return tcmalloc
    mallinfo2 = getattr(glibc(), "mallinfo2", None)
    if mallinfo2 is None or not glibc_malloc():
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks, info.fordblks, info.hblkhd


def _tcmalloc_heap() -> tuple[int, int, int] | None:
    """heap_bytes() from gperftools' MallocExtension where tcmalloc is loaded, else None."""
    try:
        get = ctypes.CDLL(None).MallocExtension_GetNumericProperty
    except (AttributeError, OSError):
        return None
    get.argtypes, get.restype = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int

    def read(name: str) -> int:
        value = ctypes.c_size_t(0)
        return value.value if get(name.encode(), ctypes.byref(value)) else 0

    in_use, heap = read("generic.current_allocated_bytes"), read("generic.heap_size")
    return in_use, heap - in_use - read("tcmalloc.pageheap_unmapped_bytes"), 0  # unmapped: given back
