"""Choosing the torch device from a user's setting ("auto", "cpu", "cuda" or "cuda:N")."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from nmt.choices import Amp, choice
from nmt.errors import ConfigError

if TYPE_CHECKING:  # torch is imported inside the functions that use it
    import torch


def resolve_device(name: str, option: str = "device=") -> str:
    """The device `name` asks for; "auto" means CUDA when a GPU is visible. `option` names the setting in
    error messages ("device=" for the Hydra commands, "--device " for nmt-translate)."""
    import torch  # here, not at import time: nmt-translate answers --help and errors without loading torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"{option}{name} is not a device; use auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{option}{name} but no CUDA GPU is visible; use {option}cpu or {option}auto")
    return name


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes matmuls in on `device_type` ("cpu", "cuda"), or None outside autocast."""
    import torch

    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def step_dtype(device_type: str) -> torch.dtype | None:
    """The dtype the attention's keys and values are held in while decoding step by step, and its per-step
    products (a_t V, q_t K^T) computed in: fp32 on a CPU, else the autocast dtype (None: as they are).

    A step's product is a batch of vector-matrix products, (B, 1, S) x (B, S, D). On the CPU measured (an
    Intel Xeon with AMX; others not yet) they ran faster in fp32 than through oneDNN's bf16 kernels, which
    are compiled, and kept at about half a megabyte each, for every new (B, S): about 700 in an epoch of the
    multi30k_deen preset (README, "The compiled-kernel cache")."""
    import torch

    return torch.float32 if device_type == "cpu" else autocast_dtype(device_type)


# /proc/cpuinfo flags that decide how fast a CPU computes this model's matmuls in fp32 and in bf16
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# oneDNN ISAs (ONEDNN_MAX_CPU_ISA) below AVX-512 BF16: with one of these set, oneDNN has no bf16 kernel to run
_ONEDNN_NO_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


@cache
def cpu_flags() -> dict[str, bool]:
    """Which of CPU_FLAGS /proc/cpuinfo lists (all False where it lists none: not Linux, or not x86)."""
    from pathlib import Path

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())
    return {name: name in flags for name in CPU_FLAGS}


def cpu_kind(flags: dict[str, bool] | None = None) -> str:
    """One word for the CPU's matmul hardware, from `flags` (default cpu_flags()): AMX, AVX512_BF16, AVX512,
    AVX2, or the machine's architecture (AARCH64, ...) on CPUs without these x86 flags."""
    import platform

    flags = cpu_flags() if flags is None else flags
    for kind, flag in (("AMX", "amx_bf16"), ("AVX512_BF16", "avx512_bf16"), ("AVX512", "avx512f"), ("AVX2", "avx2")):
        if flags.get(flag):
            return kind
    return (platform.machine() or "unknown").upper()


def onednn_isa_limit() -> str | None:
    """ONEDNN_MAX_CPU_ISA (or its older name DNNL_MAX_CPU_ISA) where it keeps oneDNN, which computes torch's bf16
    matmuls and LSTMs on a CPU, below AVX-512 BF16; None where it is unset or allows bf16."""
    import os

    value = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return value if value in _ONEDNN_NO_BF16 else None


@cache
def native_bf16(device_type: str) -> bool:
    """Whether `device_type` computes bf16 matmuls in hardware: CUDA GPUs from Ampere on, and CPUs with
    AVX-512 BF16 or AMX (the README's Performance section has the measured gain over fp32) unless
    ONEDNN_MAX_CPU_ISA keeps oneDNN below them (onednn_isa_limit). Elsewhere bf16 is emulated and slower than
    fp32 (an AVX2 CPU: about 1 GFLOP/s against 110-165 for fp32, issue 42; bf16_reason says which case)."""
    import torch

    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu" and onednn_isa_limit() is None:
        for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
            check = getattr(torch.cpu, probe, None)  # private helpers: absent on some builds
            try:
                if check is not None and check():
                    return True
            except RuntimeError:
                pass
    return False


def bf16_reason(device_type: str) -> str:
    """Why bf16 is native on `device_type` or not (native_bf16), in words for the log lines and reports, e.g.
    "AMX computes bf16 natively" or "this CPU has no native bf16 (AVX2, no AVX-512 BF16 or AMX), where bf16
    matmuls are emulated and slower"."""
    native = native_bf16(device_type)
    if device_type == "cuda":
        return "this GPU computes bf16 natively" if native else "no CUDA GPU with native bf16 (Ampere or later)"
    if device_type != "cpu":
        return f"no native bf16 known on {device_type}"
    flags = cpu_flags()
    if native:
        unit = "AMX" if flags["amx_bf16"] else "AVX-512 BF16" if flags["avx512_bf16"] else "this CPU"
        return f"{unit} computes bf16 natively"
    limit = onednn_isa_limit()
    if limit is not None:
        return (
            f"ONEDNN_MAX_CPU_ISA={limit} keeps oneDNN below AVX-512 BF16 on this {cpu_kind(flags)} CPU, "
            "where bf16 matmuls are emulated and slower"
        )
    return (
        f"this CPU has no native bf16 ({cpu_kind(flags)}, no AVX-512 BF16 or AMX), "
        "where bf16 matmuls are emulated and slower"
    )


def precision_choice(amp: str, device_type: str, option: str = "amp") -> tuple[bool, str]:
    """(whether to compute under bf16 autocast, why): amp is "bf16", or "auto" on hardware with native bf16
    (never bf16 under auto without it); anything but auto, bf16 or off is a ConfigError naming `option`.
    The reason names the setting and, for auto, bf16_reason's words, e.g. "trainer.amp=auto: AMX computes
    bf16 natively"."""
    amp = choice(Amp, amp, option)
    if amp == Amp.off:
        return False, f"{option}=off"
    if amp == Amp.bf16:
        native = native_bf16(device_type)
        return True, f"{option}=bf16" + ("" if native else f", although {bf16_reason(device_type)}")
    return native_bf16(device_type), f"{option}=auto: {bf16_reason(device_type)}"


def use_bf16(amp: str, device_type: str, option: str = "amp") -> bool:
    """Whether to compute under bf16 autocast (precision_choice without the reason)."""
    return precision_choice(amp, device_type, option)[0]


# What makes torch compute as on an AVX2-only CPU (scripts/benchmark.py and step_profile.py --emulate-avx2):
# ATen's vectorised kernels and Inductor's generated code (ATEN_CPU_CAPABILITY), oneDNN (LSTMs, bf16 matmuls:
# ONEDNN_MAX_CPU_ISA) and MKL (fp32 matmuls: MKL_ENABLE_INSTRUCTIONS). Each read once, when its library starts.
AVX2_EMULATION = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
_EMULATED = "NMT_EMULATED"  # set in the re-executed process: what it emulates


def emulate_avx2() -> None:
    """Start this process again (os.execve: same arguments) with AVX2_EMULATION in its environment, unless it
    already runs so; then check that torch took it (ConfigError if not: a CPU without AVX2, say). An emulation
    on a bigger CPU is not an AVX2 machine: its caches, clock and memory stay the bigger CPU's."""
    import os
    import sys

    if os.environ.get(_EMULATED) != "avx2":
        sys.stdout.flush(), sys.stderr.flush()
        os.execve(sys.executable, list(sys.orig_argv), {**os.environ, **AVX2_EMULATION, _EMULATED: "avx2"})
    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        raise ConfigError(
            f"--emulate-avx2: torch runs {torch.backends.cpu.get_cpu_capability()} kernels despite "
            "ATEN_CPU_CAPABILITY=avx2 (a CPU without AVX2?)"
        )


def emulated() -> str | None:
    """ "avx2" in a process that emulate_avx2 started (with every variable of AVX2_EMULATION in force), else None."""
    import os

    ok = os.environ.get(_EMULATED) == "avx2" and all(os.environ.get(k) == v for k, v in AVX2_EMULATION.items())
    return "avx2" if ok else None


def describe_machine(threads: int) -> dict:
    """What a measurement ran on, for benchmark reports: CPU model, the instruction set torch's CPU kernels
    use (cpu_capability: AVX2, AVX512, ...), the CPU's kind and flags that matter (cpu_kind, cpu_flags), a
    ONEDNN_MAX_CPU_ISA below bf16 if set, an emulation (emulate_avx2), whether bf16 is native (AVX-512 BF16 /
    AMX), the malloc in use, cores, threads, versions."""
    import os
    import platform
    from pathlib import Path

    import torch

    from nmt.memory import malloc_in_use

    cpu = platform.processor() or "unknown"
    try:
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's kernels (ATEN_CPU_CAPABILITY caps it)
        "cpu_kind": cpu_kind(),  # the hardware's, from its flags (an emulation does not change it)
        "cpu_flags": cpu_flags(),
        "onednn_max_cpu_isa": onednn_isa_limit(),
        "emulated": emulated(),  # "avx2": ATEN/oneDNN/MKL kept to AVX2 on a bigger CPU (not a real AVX2 machine)
        "native_bf16": native_bf16("cpu"),
        "malloc": malloc_in_use(),  # glibc or tcmalloc (nmt.memory): the peak memory depends on it
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "threads": threads,
        "torch": str(torch.__version__),  # a plain str: torch.load(weights_only=True) refuses TorchVersion
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def code_commit() -> str | None:
    """The git commit of the checkout this package runs from ("<hash>", or "<hash>-dirty" with uncommitted
    changes to tracked files); None outside a git checkout or without git."""
    import subprocess
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20)
        if head.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def provenance(threads: int) -> dict:
    """Where and with what a run trains: the code's commit (code_commit) and describe_machine's facts."""
    return {"commit": code_commit(), **describe_machine(threads)}


def run_lstm(rnn, x, state=None):
    """`rnn(x, state)` for an nn.LSTM over an unpacked (B, S, E) batch, under bf16 autocast or not.

    On a CPU without bf16 hardware (AVX2 only, say) oneDNN has no bf16 LSTM kernel, and nn.LSTM under CPU
    autocast fails with "could not create a primitive descriptor for the LSTM forward propagation primitive".
    There the LSTM runs in fp32 with autocast paused (every other op stays bf16), so `trainer.amp=bf16` and
    `--amp bf16` work on every CPU. Packed sequences take another kernel that runs in fp32 anyway.
    """
    import torch

    if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and not native_bf16("cpu"):
        with torch.autocast("cpu", enabled=False):
            state = None if state is None else tuple(s.float() for s in state)
            return rnn(x.float(), state)
    return rnn(x, state)


def matmul_rate(threads: int, seconds: float, n: int = 512, dtype=None) -> dict:
    """Sustained GFLOP/s of an n x n x n torch.mm in `dtype` (default fp32; 2 n^3 FLOPs per call) at `threads`
    threads: the yardstick the benchmarks divide their achieved FLOP rates by."""
    import time

    import torch

    dtype = dtype or torch.float32
    torch.set_num_threads(threads)
    a, b, out = (torch.randn(n, n, dtype=dtype) for _ in range(3))
    for _ in range(10):
        torch.mm(a, b, out=out)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            torch.mm(a, b, out=out)
        calls += 10
    elapsed = time.perf_counter() - start
    return {
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": threads,
        "calls": calls,
        "seconds": round(elapsed, 3),
        "gflops": round(2 * n**3 * calls / elapsed / 1e9, 1),
    }
