"""Choosing the torch device from a user's setting ("auto", "cpu", "cuda" or "cuda:N")."""

from __future__ import annotations

from nmt.errors import ConfigError


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


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` computes bf16 matmuls in hardware: CUDA GPUs from Ampere on, and CPUs with
    AVX-512 BF16 or AMX (where bf16 training steps ran ~1.4x faster than fp32 in this project's measurements).
    Elsewhere bf16 is emulated and slower than fp32."""
    import torch

    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
            check = getattr(torch.cpu, probe, None)  # private helpers: absent on some builds
            try:
                if check is not None and check():
                    return True
            except RuntimeError:
                pass
    return False
