"""Precision and kernels chosen per machine, and the reasons the log lines give (nmt.precision, nmt.cpu,
nmt.kernels.compiled).

    python -m pytest -q tests/test_device.py

No test depends on the CPU it runs on: native_bf16, the CPU's flags and the compiler are monkeypatched.
"""

from __future__ import annotations

import pytest
import torch

import nmt.cpu
from nmt import precision, provenance
from nmt.errors import ConfigError

NONE = dict.fromkeys(nmt.cpu.CPU_FLAGS, False)
FLAGS = {  # each CPU kind with the flags it has (a CPU of a kind has the flags of the kinds below it)
    "AVX2": {**NONE, "avx2": True},
    "AVX512": {**NONE, "avx2": True, "avx512f": True},
    "AVX512_BF16": {**NONE, "avx2": True, "avx512f": True, "avx512_bf16": True},
    "AMX": {**NONE, "avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": True, "amx_tile": True},
}


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to run on a CPU of a given kind: cpu(kind, native) patches the flags and native_bf16."""

    def pretend(kind: str, native: bool) -> None:
        monkeypatch.setattr(nmt.cpu, "cpu_flags", lambda: FLAGS[kind])
        monkeypatch.setattr(precision, "native_bf16", lambda device_type: native)

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    return pretend


@pytest.mark.parametrize("kind", sorted(FLAGS))
def test_cpu_kind_names_the_best_matmul_hardware(kind):
    assert nmt.cpu.cpu_kind(FLAGS[kind]) == kind
    assert nmt.cpu.cpu_kind(NONE) not in FLAGS  # no x86 flags (an ARM CPU): the architecture's name


@pytest.mark.parametrize("kind", ["AVX2", "AVX512"])
def test_auto_never_picks_bf16_without_native_bf16_and_says_why(cpu, kind):
    cpu(kind, native=False)
    bf16, why = precision.precision_choice("auto", "cpu", "trainer.amp")
    assert bf16 is False
    assert why == (
        f"trainer.amp=auto: this CPU has no native bf16 ({kind}, no AVX-512 BF16 or AMX), "
        "where bf16 matmuls are emulated and slower"
    )
    assert precision.use_bf16("auto", "cpu") is False


@pytest.mark.parametrize("kind, unit", [("AMX", "AMX"), ("AVX512_BF16", "AVX-512 BF16")])
def test_auto_picks_bf16_where_the_cpu_computes_it_natively(cpu, kind, unit):
    cpu(kind, native=True)
    assert precision.precision_choice("auto", "cpu", "trainer.amp") == (
        True,
        f"trainer.amp=auto: {unit} computes bf16 natively",
    )


def test_bf16_and_off_are_obeyed_and_a_forced_bf16_says_it_is_emulated(cpu):
    cpu("AVX2", native=False)
    bf16, why = precision.precision_choice("bf16", "cpu", "--amp")
    assert bf16 is True and why.startswith("--amp=bf16, although this CPU has no native bf16 (AVX2")
    assert precision.precision_choice("off", "cpu", "--amp") == (False, "--amp=off")
    cpu("AMX", native=True)
    assert precision.precision_choice("bf16", "cpu", "--amp") == (True, "--amp=bf16")
    with pytest.raises(ConfigError, match="trainer.amp"):
        precision.precision_choice("fp16", "cpu", "trainer.amp")


def test_onednn_limited_below_bf16_means_no_native_bf16(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 (scripts/benchmark.py --emulate-avx2) leaves oneDNN no bf16 kernel: auto is fp32
    on any CPU, and the reason names the variable. A value that allows bf16 is no limit."""
    monkeypatch.setattr(nmt.cpu, "cpu_flags", lambda: FLAGS["AMX"])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    precision.native_bf16.cache_clear()
    try:
        assert nmt.cpu.onednn_isa_limit() == "AVX2" and precision.native_bf16("cpu") is False
        bf16, why = precision.precision_choice("auto", "cpu", "trainer.amp")
        assert bf16 is False and "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN below AVX-512 BF16 on this AMX CPU" in why
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
        assert nmt.cpu.onednn_isa_limit() is None
    finally:
        precision.native_bf16.cache_clear()


def test_the_machine_record_has_the_cpu_kind_and_flags():
    machine = provenance.describe_machine(1)
    assert machine["cpu_kind"] == nmt.cpu.cpu_kind() and set(machine["cpu_flags"]) == set(nmt.cpu.CPU_FLAGS)
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_the_decoding_report_says_why_its_precision():
    from nmt.evaluation import _decoding_line

    decoding = {"beam_size": 5, "length_penalty": 1.0, "max_len_ratio": 2.0, "max_len_extra": 10, "precision": "fp32"}
    assert _decoding_line({"decoding": decoding}).endswith(", fp32")  # a report from before the reason existed
    decoding["precision_reason"] = "amp=auto: this CPU has no native bf16"
    assert _decoding_line({"decoding": decoding}).endswith(", fp32 (amp=auto: this CPU has no native bf16)")
    decoding["kernels_resolved"] = "compiled"  # the decoder step's C++ kernels (decoding.kernels)
    assert _decoding_line({"decoding": decoding}).endswith("no native bf16), compiled kernels")


def test_the_machine_record_names_the_malloc(monkeypatch):
    """Peak memory depends on the malloc (nmt.memory): glibc without LD_PRELOAD, else the preloaded library."""
    from nmt.memory import malloc_in_use

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert malloc_in_use() == "glibc" and provenance.describe_machine(1)["malloc"] == "glibc"
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
    assert malloc_in_use() == "tcmalloc"
