"""What a run or a measurement ran on and with: the machine (describe_machine: CPU model and kind, flags, torch's
kernels, an emulation, native bf16, malloc, cores, threads, versions) and the code's commit (code_commit), for
checkpoints, metrics.json and benchmark reports."""

from __future__ import annotations

from nmt import cpu, precision


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

    model = platform.processor() or "unknown"
    try:
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        model = names[0] if names else model
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's kernels (ATEN_CPU_CAPABILITY caps it)
        "cpu_kind": cpu.cpu_kind(),  # the hardware's, from its flags (an emulation does not change it)
        "cpu_flags": cpu.cpu_flags(),
        "onednn_max_cpu_isa": cpu.onednn_isa_limit(),
        "emulated": cpu.emulated(),  # "avx2": ATEN/oneDNN/MKL kept to AVX2 on a bigger CPU (not a real AVX2 machine)
        "native_bf16": precision.native_bf16("cpu"),
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
