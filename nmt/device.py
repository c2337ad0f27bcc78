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
