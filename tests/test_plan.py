"""A run's plan (nmt.plan): one implementation for every component, each with its reason, chosen in one place
from the device, the precision, the threads, the model and `kernels`; a kernel that a call does not take says so
once; the plan is logged, and recorded in metrics.json and in every checkpoint."""

import json
import logging
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BIN, TINY

from nmt.checkpoint import load_checkpoint
from nmt.errors import ConfigError
from nmt.kernels import compiled
from nmt.kernels.encoder_lstm import encoder_lstm
from nmt.plan import COMPONENTS, KERNEL_COMPONENTS, Inputs, Shape, choose

PRESET = Shape(additive=True, input_feeding=True)  # the multi30k_deen preset's model
RNNSEARCH = Shape(additive=True, input_feeding=False, query_previous=True)


def inputs(**changes) -> Inputs:
    return Inputs(**{"device": "cpu", "bf16": False, "bf16_why": "no bf16 here", "threads": 2, **changes})


def test_every_component_has_an_implementation_and_a_reason(monkeypatch):
    monkeypatch.setattr(compiled, "has_compiler", lambda: True)
    for i in (inputs(), inputs(bf16=True), inputs(device="cuda", bf16=True), inputs(purpose="decode")):
        for shape in (PRESET, RNNSEARCH, Shape(additive=False)):
            plan = choose(i, shape)
            assert list(plan.record()) == list(COMPONENTS)
            assert all(p["implementation"] and p["reason"] for p in plan.record().values())
            assert len(plan.table()) == len(COMPONENTS)


def test_auto_takes_each_kernel_where_it_applies(monkeypatch):
    """fp32 on a CPU with a compiler: every kernel the preset's model has, the encoder's at any thread count;
    under bf16 the fp32-only ones say why not; on CUDA none; eager none."""
    monkeypatch.setattr(compiled, "has_compiler", lambda: True)
    for threads in (1, 2, 3, 8):
        assert choose(inputs(threads=threads), PRESET).kernels == frozenset(KERNEL_COMPONENTS)
    plan = choose(inputs(), PRESET)
    assert plan.record()["decoder_step"]["implementation"].startswith("feed_loop.cpp")
    assert choose(inputs(), RNNSEARCH).record()["decoder_step"]["implementation"].startswith("decoder_loop")
    luong = choose(inputs(), Shape(additive=False))
    assert "attention_energy" not in luong.kernels
    assert luong.record()["attention_energy"]["implementation"] == "not used"
    bf16 = choose(inputs(bf16=True), PRESET)
    assert {"encoder", "output_loss", "dropout_mask", "beam_topk"}.isdisjoint(bf16.kernels)
    assert bf16.record()["encoder"]["reason"] == "the kernel takes one bidirectional fp32 layer"
    cuda = choose(inputs(device="cuda", bf16=True), PRESET)
    assert not cuda.kernels and cuda.record()["encoder"]["reason"] == "the kernels are CPU code, this is cuda"
    eager = choose(inputs(kernels="eager"), PRESET)
    assert not eager.kernels and eager.record()["decoder_step"]["reason"] == "kernels=eager"
    search = choose(inputs(purpose="decode"), PRESET)
    assert search.kernels == {"encoder", "decoder_step", "beam_topk"}


def test_without_a_compiler_auto_says_so_and_compiled_insists(monkeypatch):
    monkeypatch.setattr(compiled, "has_compiler", lambda: False)
    plan = choose(inputs(), PRESET)
    assert not plan.kernels and "no C++ compiler on PATH" in plan.record()["encoder"]["reason"]
    insisted = choose(inputs(kernels="compiled"), PRESET)
    assert insisted.strict and insisted.kernels == frozenset(KERNEL_COMPONENTS)


def test_kernels_off_turns_single_components_back_to_torch(monkeypatch):
    monkeypatch.setattr(compiled, "has_compiler", lambda: True)
    plan = choose(inputs(kernels_off=("encoder", "step_products")), PRESET)
    assert plan.kernels == frozenset(KERNEL_COMPONENTS) - {"encoder", "step_products"}
    assert plan.record()["encoder"] == {"implementation": "nn.LSTM (oneDNN)", "reason": "kernels_off"}
    # the input-feeding loop needs the weights in panels: without them, the step kernels one by one
    assert not plan.record()["decoder_step"]["implementation"].startswith("feed_loop")
    with pytest.raises(ConfigError, match="kernels_off=.*'encodr'.*use some of encoder"):
        choose(inputs(kernels_off=("encodr",)), PRESET)
    with pytest.raises(ConfigError, match="kernels='auto_fp32': use one of auto, eager, compiled"):
        choose(inputs(kernels="auto_fp32"), PRESET)


def test_a_call_the_kernel_does_not_take_is_logged_once_with_why(caplog, monkeypatch):
    """The encoder's kernel in the plan, a call in fp64: nn.LSTM for that call, one log line for all such calls;
    nothing is logged where the plan has the kernel off."""
    monkeypatch.setattr(compiled, "_fell_back", set())
    rnn, x = torch.nn.LSTM(4, 3, batch_first=True, bidirectional=True).double(), torch.randn(2, 5, 4).double()
    compiled.use_kernels({"encoder"})
    with caplog.at_level(logging.INFO, logger="nmt.kernels.compiled"):
        assert encoder_lstm(rnn, x) is None and encoder_lstm(rnn, x) is None
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["encoder: the torch form for such calls, not the plan's kernel: not a (B, S, E) fp32 CPU batch"]
    assert compiled.fallbacks() == [{"component": "encoder", "why": "not a (B, S, E) fp32 CPU batch"}]
    compiled.use_kernels(())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nmt.kernels.compiled"):
        assert encoder_lstm(rnn, x.float()) is None
    assert not caplog.records


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """`nmt-train experiment=quick` shrunk to 6 steps (conftest.TINY): its run directory. The plan is chosen before
    step 1, so the preset's few steps show it as well as a long run."""
    root = tmp_path_factory.mktemp("plan")
    cmd = [str(BIN / "nmt-train"), *TINY, f"hydra.run.dir={root / 'run'}", f"paths.data_dir={root / 'data'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root / "run"


def test_a_quick_runs_metrics_and_checkpoints_carry_the_plan(tiny_run):
    """`nmt-train experiment=quick`: metrics.json's plan names every component with a reason, and each checkpoint's
    provenance holds the same plan."""
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    plan = metrics["plan"]
    assert len(plan) >= 6 and all(p["implementation"] and p["reason"] for p in plan.values())
    assert {"encoder", "decoder_step", "attention_energy", "output_loss", "dropout_mask", "beam_topk"} <= set(plan)
    assert {"allocator", "threads"} <= set(plan)
    assert isinstance(metrics["fallbacks"], list)
    for name in ("best.pt", "last.pt"):
        assert load_checkpoint(tiny_run / "checkpoints" / name)["provenance"]["plan"] == plan
    log = (tiny_run / "train.log").read_text()
    assert "plan:" in log and all(f"  {component} " in log for component in plan)  # the table, before step 1
    assert log.index("plan:") < log.index("step ")
