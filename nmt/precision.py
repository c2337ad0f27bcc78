"""Computing in bf16 or fp32: whether the hardware computes bf16 natively (native_bf16, and why: bf16_reason), the
choice for a setting (trainer.amp, --amp: precision_choice), and an nn.LSTM under bf16 autocast on any CPU
(run_lstm)."""

from __future__ import annotations

from functools import cache

from nmt import cpu
from nmt.choices import Amp, choice


@cache
def native_bf16(device_type: str) -> bool:
    """Whether `device_type` computes bf16 matmuls in hardware: CUDA GPUs from Ampere on, and CPUs with
    AVX-512 BF16 or AMX (the README's Performance section has the measured gain over fp32) unless
    ONEDNN_MAX_CPU_ISA keeps oneDNN below them (onednn_isa_limit). Elsewhere bf16 is emulated and slower than
    fp32 (on an AVX2 EPYC a 512^3 torch.mm ran at 1.2-1.3 GFLOP/s in bf16 against 129-170 in fp32, the `matmul_bf16`
    and `matmul` of docs/benchmark/train_multi30k_fp32_avx2-epyc*.json; bf16_reason says which case)."""
    import torch

    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu" and cpu.onednn_isa_limit() is None:
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
    flags = cpu.cpu_flags()
    if native:
        unit = "AMX" if flags["amx_bf16"] else "AVX-512 BF16" if flags["avx512_bf16"] else "this CPU"
        return f"{unit} computes bf16 natively"
    limit = cpu.onednn_isa_limit()
    if limit is not None:
        return (
            f"ONEDNN_MAX_CPU_ISA={limit} keeps oneDNN below AVX-512 BF16 on this {cpu.cpu_kind(flags)} CPU, "
            "where bf16 matmuls are emulated and slower"
        )
    return (
        f"this CPU has no native bf16 ({cpu.cpu_kind(flags)}, no AVX-512 BF16 or AMX), "
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
