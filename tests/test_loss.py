"""The output layer inside the loss (nmt.loss.output_loss_sum, fp32 training on a CPU) against the layer and
the loss apart: the same value and the same gradients, whatever the rows, the pieces and the label smoothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt import loss as loss_module
from nmt.device_plan import WorkSizes, imposed
from nmt.loss import loss_rows, loss_sum, output_loss_sum
from nmt.model import ModelConfig, Seq2Seq
from nmt.special import PAD_ID


def gradients(tensors):
    out = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    return out


@pytest.mark.parametrize("N", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("rows, piece", [(16, 16), (8, 3), (64, None)])
def test_output_layer_in_the_loss_equals_the_layer_then_the_loss(N, smoothing, rows, piece, monkeypatch):
    check_against_the_layer_then_the_loss(N, smoothing, rows, piece, 37, monkeypatch)


@pytest.mark.parametrize("N", [1, 17, 40])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("V", [37, 64, 8000])
def test_the_loss_kernel_equals_the_layer_then_the_loss(N, smoothing, V, compiled, monkeypatch, kernel_calls):
    """With the compiled kernels each piece's loss and gradient is one C++ call (nmt.kernels.smoothed_xent), and where
    there is more than one piece their logits come from W^T packed once (nmt.kernels.step_gemm): the same value
    and gradients, for vocabularies that fill the vector width or leave a tail, PAD rows included."""
    calls, products = [], []
    kernel, product = loss_module.smoothed_xent, loss_module.step_gemm.product
    monkeypatch.setattr(loss_module, "smoothed_xent", lambda *args: calls.append(1) or kernel(*args))
    monkeypatch.setattr(loss_module.step_gemm, "product", lambda *a, **k: products.append(1) or product(*a, **k))
    check_against_the_layer_then_the_loss(N, smoothing, 16, None, V, monkeypatch)
    assert len(calls) == -(-N // 16)
    assert len(products) == (len(calls) if N > 16 else 0)
    assert kernel_calls["smoothed_xent.cpp"] > 0


def test_the_loss_kernel_sums_the_bias_gradient_the_same_every_run(compiled, kernel_calls):
    """The kernel adds the gradient's column sums (the bias's gradient) into the given vector, the threads' sums
    in a fixed order: two runs on the same logits give the same bits, and the sum of the gradient rows."""
    torch.manual_seed(0)
    z, bias, target = torch.randn(300, 8000), torch.randn(8000), torch.randint(4, 8000, (300,))
    target[::7] = PAD_ID
    runs = []
    for _ in range(2):
        g, losses, sums = z.clone(), torch.empty(300), torch.full((8000,), 0.5)
        assert loss_module.smoothed_xent(g, bias, target, losses, 0.1, PAD_ID, sums)
        runs.append(sums)
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    torch.testing.assert_close(runs[0], 0.5 + g.sum(0), rtol=0, atol=1e-5)
    assert kernel_calls["smoothed_xent.cpp"] > 0


def check_against_the_layer_then_the_loss(N, smoothing, rows, piece, V, monkeypatch):
    monkeypatch.setattr(loss_module, "OUTPUT_ROWS", rows)  # logits made `rows` at a time, `piece` rows per pass
    torch.manual_seed(N)
    H = 12
    layer = torch.nn.Linear(H, V)
    hidden = torch.randn(N, H, requires_grad=True)
    target = torch.randint(4, V, (N,))
    target[::3] = PAD_ID  # the loss skips these rows: no loss and no gradient from them
    params = [hidden, layer.weight, layer.bias]
    with imposed(WorkSizes(loss_rows=piece, energy_elements=1 << 18)):
        fused = output_loss_sum(hidden, layer, target, smoothing)
        (fused * 0.3).backward()
    got = gradients(params)
    expected = F.cross_entropy(layer(hidden), target, ignore_index=PAD_ID, label_smoothing=smoothing, reduction="sum")
    (expected * 0.3).backward()
    want = gradients(params)
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-4)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert (got[0][target == PAD_ID] == 0).all()


def test_a_model_trained_through_either_path_gets_the_same_gradients():
    torch.manual_seed(0)
    config = ModelConfig(embed_size=16, encoder_hidden_size=16, hidden_size=32, dropout=0.0, attention="bahdanau")
    model = Seq2Seq(config, 30, 30)
    src = torch.randint(4, 30, (3, 7))
    lengths = torch.tensor([7, 7, 7])
    tgt = torch.randint(4, 30, (3, 6))
    tgt[1, 4:] = PAD_ID
    rows = loss_rows(tgt, 4)
    target = tgt.reshape(-1)[rows]
    logits, _ = model(src, lengths, tgt, rows)
    loss_sum(logits, target, 0.1).backward()
    want = gradients(list(model.parameters()))
    hidden, _ = model(src, lengths, tgt, rows, logits=False)
    assert hidden.shape == (len(rows), 32)
    output_loss_sum(hidden, model.decoder.output, target, 0.1).backward()
    got = gradients(list(model.parameters()))
    for (name, _), g, w in zip(model.named_parameters(), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6, msg=name)


def test_flop_counters_see_the_same_matmuls_either_way():
    """scripts/step_profile.py counts each phase's matmul FLOPs with torch's FLOP counter: the output layer inside
    the loss (its three products in the forward pass) counts as the layer and the loss apart do."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    layer, hidden = torch.nn.Linear(12, 37), torch.randn(40, 12, requires_grad=True)
    target = torch.randint(4, 37, (40,))
    counts = []
    for fused in (True, False):
        with FlopCounterMode(display=False) as counter:
            loss = output_loss_sum(hidden, layer, target) if fused else loss_sum(layer(hidden), target)
            loss.backward()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == 3 * 2 * 40 * 12 * 37


def test_the_fused_layer_backpropagates_once_and_takes_no_rows():
    """Its backward scales the gradients it made in place: a second backward (retain_graph) is an error, not a
    gradient scaled twice; no rows at all give zero gradients."""
    torch.manual_seed(0)
    layer, hidden = torch.nn.Linear(12, 37), torch.randn(5, 12, requires_grad=True)
    loss = output_loss_sum(hidden, layer, torch.randint(4, 37, (5,)))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once"):
        loss.backward()
    layer.weight.grad = None
    empty = torch.zeros(0, 12, requires_grad=True)
    output_loss_sum(empty, layer, torch.zeros(0, dtype=torch.long)).backward()
    assert layer.weight.grad is not None and (layer.weight.grad == 0).all()
