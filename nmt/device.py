"""Choosing the torch device from a user's setting ("auto", "cpu", "cuda" or "cuda:N"), and the dtypes a step
computes in on it. Precision (bf16 or fp32) is nmt.precision; the CPU's flags nmt.cpu."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
