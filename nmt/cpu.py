"""The CPU's matmul hardware, from its /proc/cpuinfo flags (cpu_flags, cpu_kind), a oneDNN ISA limit set in the
environment, and running this process as on an AVX2-only CPU (emulate_avx2, for the benchmarks' --emulate-avx2)."""

from __future__ import annotations

from functools import cache

from nmt.errors import ConfigError

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
