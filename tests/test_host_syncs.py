"""A training step a GPU runs without waiting: on the meta device, whose tensors hold no data, the step's
forward, loss, backward, clipping and optimizer update dispatch no operator that would make the host wait for a
GPU (nmt.dispatch.HostSyncs: reads of device tensors, copies from the host, pinned allocations), given the
batch's layout that the feed makes ahead (nmt.layout). On a CPU the layout changes nothing of the arithmetic."""

from __future__ import annotations

import contextlib
import importlib

import pytest
import torch

from nmt.decoder import STEP_ROW_MULTIPLE, active_rows
from nmt.device_batches import DeviceBatches
from nmt.device_plan import CUDA, imposed
from nmt.dispatch import HostSyncs
from nmt.kernels.decoder_loop import loop_positions
from nmt.layout import batch_layout
from nmt.loss import loss_sum, rows_of_lengths
from nmt.model import ModelConfig, Seq2Seq
from nmt.step_numbers import StepNumbers

# mixed source lengths (the packed encoder) and targets that end before the longest (the loop's rows shrink)
SRC_LENGTHS, TGT_LENGTHS = torch.tensor([7, 7, 6, 5, 7, 3]), torch.tensor([9, 8, 8, 5, 3, 2])
S, T = 7, 9

ARCHITECTURES = [  # (attention, query, input feeding, self-attention layers)
    ("bahdanau", "current", True, 0),
    ("bahdanau", "previous", False, 0),
    ("luong", "current", True, 0),
    ("luong", "current", False, 0),
    ("none", "previous", False, 0),
    ("luong", "current", True, 2),
]


@pytest.fixture
def no_autocast(monkeypatch):
    """Autocast knows no meta device: it is left out (the layout's step multiple is then 1); torch's fused Adam
    checks for a device with fused kernels, where the meta device's is the kernels' meta form."""
    import nmt.attention
    import nmt.decoder
    import nmt.device

    adam = importlib.import_module("torch.optim.adam")  # the module, not torch.optim's Adam
    monkeypatch.setattr(adam, "_device_dtype_check_for_fused", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    for module in (nmt.device, nmt.decoder, nmt.attention):
        monkeypatch.setattr(module, "autocast_dtype", lambda device_type: None)


def meta_step(attention, query, feeding, layers, layout_given: bool) -> list[tuple[str, str]]:
    """One training step of a small model on the meta device, as nmt.trainer.step takes it under the GPU's plan
    (deferred checks, fused optimizer); returns what HostSyncs found inside it."""
    torch.manual_seed(0)
    config = ModelConfig(
        8, 8, hidden_size=16, input_feeding=feeding, attention=attention, attention_query=query,
        self_attention_layers=layers, self_attention_heads=2,
    )  # fmt: skip
    model = Seq2Seq(config, 50, 50).to("meta").train()
    # the GPU's fused Adam (nmt.trainer.optimizer), which takes the deferred check's flag (nmt.step_numbers);
    # torch refuses a fused optimizer on the meta device (the `no_autocast` fixture lifts its device check);
    # the fused kernel itself has a meta form
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    numbers = StepNumbers(deferred=True)
    src, tgt_in, tgt_out = (torch.empty(6, n, dtype=torch.long, device="meta") for n in (S, T, T))
    # what the feed copies ahead of the step (nmt.device_batches), started without waiting
    rows = rows_of_lengths(TGT_LENGTHS, T).to("meta", non_blocking=True)
    layout = batch_layout(SRC_LENGTHS, TGT_LENGTHS, T, 1).to(torch.device("meta"), non_blocking=True)
    with imposed(CUDA.work), HostSyncs() as syncs:
        out, weights = model(
            src, SRC_LENGTHS, tgt_in, rows, TGT_LENGTHS, layout=layout if layout_given else None, weights=False
        )
        loss = loss_sum(out, tgt_out.reshape(-1)[rows], 0.1)
        loss.backward()
        norm = numbers.clip(model.parameters(), 1.0)
        assert numbers.admit(optimizer, loss.detach(), norm)
        optimizer.step()
    assert weights is None and out.shape == (len(rows), 50)
    return syncs.found


@pytest.mark.parametrize("attention, query, feeding, layers", ARCHITECTURES)
def test_a_training_step_with_the_feeds_layout_makes_the_host_wait_for_nothing(
    attention, query, feeding, layers, no_autocast
):
    assert meta_step(attention, query, feeding, layers, layout_given=True) == []


def test_without_the_layout_the_step_copies_from_the_host_and_the_guard_sees_it(no_autocast):
    """The guard is not blind: the loop's positions and the packed order, made inside the step, are copies; a
    device tensor's read is a read (the meta device then fails, having no data), a host tensor's is free."""
    found = meta_step("bahdanau", "current", True, 0, layout_given=False)
    assert ("copies from the host", "_to_copy") in found
    with HostSyncs() as syncs:
        assert bool(torch.ones(()) > 0)  # a host tensor: read for nothing
        torch.tensor([1.0]).to("meta", non_blocking=True)
        with pytest.raises(RuntimeError, match="meta tensors"):
            bool(torch.ones((), device="meta"))
    assert syncs.found == [("copies from the host", "_to_copy"), ("reads a device tensor", "_local_scalar_dense")]


def test_the_layout_is_the_order_and_positions_the_model_would_make():
    for multiple in (1, STEP_ROW_MULTIPLE):
        layout = batch_layout(SRC_LENGTHS, TGT_LENGTHS, T, multiple)
        assert torch.equal(layout.src_order, torch.sort(SRC_LENGTHS, descending=True)[1])
        tgt_in = torch.where(torch.arange(T) < TGT_LENGTHS[:, None], 5, 0)  # PAD_ID after each sentence
        active = active_rows(tgt_in, multiple)
        assert torch.equal(layout.loop_positions, loop_positions(active, T, torch.device("cpu")))


@pytest.mark.parametrize("attention, query, feeding, layers", [ARCHITECTURES[0], ARCHITECTURES[-1]])
def test_on_a_cpu_the_layout_changes_nothing_of_the_loss_or_the_gradients(attention, query, feeding, layers):
    """The same batch with and without the feed's layout: the same loss and gradients, bit for bit (the packed
    encoder, the decoder loop's shrinking rows and the self-attended summary all take it)."""
    config = ModelConfig(
        8, 8, hidden_size=16, input_feeding=feeding, attention=attention, attention_query=query,
        self_attention_layers=layers, self_attention_heads=2,
    )  # fmt: skip
    g = torch.Generator().manual_seed(3)
    src = torch.where(torch.arange(S) < SRC_LENGTHS[:, None], torch.randint(4, 50, (6, S), generator=g), 0)
    tgt = torch.where(torch.arange(T) < TGT_LENGTHS[:, None], torch.randint(4, 50, (6, T), generator=g), 0)
    rows = rows_of_lengths(TGT_LENGTHS, T)
    results = []
    for layout in (None, batch_layout(SRC_LENGTHS, TGT_LENGTHS, T, 1)):
        torch.manual_seed(0)
        model = Seq2Seq(config, 50, 50).eval()  # no dropout: the two passes draw nothing
        out, _ = model(src, SRC_LENGTHS, tgt, rows, TGT_LENGTHS, layout=layout, weights=False)
        loss = loss_sum(out, tgt.reshape(-1)[rows], 0.1)
        loss.backward()
        results.append([loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_a_layout_made_for_another_step_multiple_is_refused(no_autocast):
    config = ModelConfig(8, 8, hidden_size=16, input_feeding=True, attention="bahdanau", attention_query="current")
    model = Seq2Seq(config, 50, 50)
    src = torch.where(torch.arange(S) < SRC_LENGTHS[:, None], 5, 0)
    tgt = torch.where(torch.arange(T) < TGT_LENGTHS[:, None], 5, 0)
    layout = batch_layout(SRC_LENGTHS, TGT_LENGTHS, T, STEP_ROW_MULTIPLE)
    with pytest.raises(ValueError, match="another step multiple"):
        model(src, SRC_LENGTHS, tgt, None, TGT_LENGTHS, layout=layout)


def test_the_feed_makes_layouts_for_a_device_other_than_the_cpu():
    from nmt.data import EncodedSplit

    split = EncodedSplit([[5] * n for n in (3, 7, 5, 2)], [[6] * n for n in (4, 2, 6, 1)])
    cpu = DeviceBatches(CUDA.__class__(**{**CUDA.__dict__, "pin_memory": False}), torch.device("cpu"))
    meta = DeviceBatches(CUDA.__class__(**{**CUDA.__dict__, "pin_memory": False}), torch.device("meta"), 8)
    [(_, _, none)] = cpu.take(split, [[0, 1, 2, 3]])
    [(batch, _, layout)] = meta.take(split, [[0, 1, 2, 3]])
    assert none is None
    assert layout.src_order.device.type == "meta" and layout.step_multiple == 8
    expected = batch_layout(batch.src_lengths, batch.tgt_lengths, batch.tgt_in.size(1), 8)
    assert layout.loop_positions.shape == expected.loop_positions.shape
