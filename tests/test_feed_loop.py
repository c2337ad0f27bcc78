"""The input-feeding decoder's teacher-forced loop as one autograd node (nmt.kernels.feed_loop) gives the numbers and
gradients of the same loop through autograd, step by step, draws the same dropout masks, and runs only where it
applies."""

import pytest
import torch
from test_decoder_loop import batch, model_of, train_step  # tests/ is on sys.path (pytest's prepend import mode)

import nmt.decoder as decoder_module
import nmt.kernels.feed_loop as loop_module
from nmt.kernels.compiled import set_kernels

FEEDING = dict(attention_query="current", input_feeding=True)  # the multi30k_deen preset's decoder


def count_calls(monkeypatch) -> list:
    calls = []
    apply = loop_module._FeedLoop.apply
    monkeypatch.setattr(loop_module._FeedLoop, "apply", lambda *args: calls.append(1) or apply(*args))
    return calls


MANY = sorted(((7 * i) % 12 + 1 for i in range(29)), reverse=True)  # 29 sentences, 183 rows over 12 steps


@pytest.mark.parametrize(
    "tgt_lengths", [[8, 6, 6, 2, 1], [3, 8, 2, 6, 6], MANY], ids=["shrinking", "unsorted", "many-rows"]
)
@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no-dropout", "dropout"])
def test_the_feed_loop_node_gives_the_autograd_loops_numbers(tgt_lengths, dropout, compiled, monkeypatch):
    """The same loss, weights and gradients as the step-by-step loop through autograd on the same kernels, on
    a batch whose sentences leave the loop at different steps (shrinking) or whose rows all stay (not sorted
    longest first), and one whose rows of all steps (183) fill several of the weights' gradient row multiples
    (nmt.shapes: the rows the kernel writes, the zero rows after them) and several register blocks; with
    dropout, the same masks from the same seed (drawn step after step as the loop draws them), so a seeded or
    resumed run trains the same either way."""
    model, data = model_of(**FEEDING, dropout=dropout), batch(tgt_lengths)
    model.train()
    calls = count_calls(monkeypatch)
    torch.manual_seed(11)
    fused = train_step(model, *data, amp=False)
    after_fused = torch.rand(3)  # the generator's state after the step: the same draws were taken
    assert calls == [1]
    monkeypatch.setattr(decoder_module, "feed_plan", lambda *args: None)
    torch.manual_seed(11)
    loop = train_step(model, *data, amp=False)
    torch.testing.assert_close(after_fused, torch.rand(3), rtol=0, atol=0)
    (loss, weights, grads), (loss_ref, weights_ref, grads_ref) = fused, loop
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(weights, weights_ref, rtol=1e-6, atol=1e-7)
    assert set(grads) == set(grads_ref)
    for k, grad in grads_ref.items():
        torch.testing.assert_close(grads[k], grad, rtol=1e-5, atol=1e-6, msg=k)
        assert grad.abs().sum() > 0 or k.startswith("encoder.embed"), k  # every gradient reached


def test_the_feed_loop_node_passes_the_initial_states_gradient(compiled, monkeypatch):
    """With a bridge from the encoder, the gradient of the decoder's first state flows back into the encoder
    (the bridge's weights and the encoder's last states) as the plain loop's does."""
    model, data = model_of(**FEEDING), batch([5, 4, 2])
    calls = count_calls(monkeypatch)
    fused = train_step(model, *data, amp=False)[2]
    monkeypatch.setattr(decoder_module, "feed_plan", lambda *args: None)
    loop = train_step(model, *data, amp=False)[2]
    assert calls == [1]
    for k in ("decoder.bridge_h.weight", "decoder.bridge_c.weight", "encoder.rnn.weight_hh_l0"):
        assert loop[k].abs().sum() > 0, k
        torch.testing.assert_close(fused[k], loop[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize(
    "changes",
    [
        dict(input_feeding=False),
        dict(**FEEDING, decoder_layers=2),
        dict(**FEEDING, attention="luong", attention_options={"score": "concat"}),
        dict(attention_query="previous", input_feeding=True),
    ],
    ids=["no-feeding", "two-layers", "luong-concat", "bahdanau-order"],
)
def test_the_feed_loop_node_runs_for_its_decoder_only(changes, compiled, monkeypatch):
    """Another decoder (no input feeding, two layers, another attention, the query before the LSTM), a pass
    without gradient, bf16 autocast and eager kernels take the step-by-step loop."""
    calls = count_calls(monkeypatch)
    src, src_lengths, tgt_in, _ = batch([8, 6, 6, 2])
    model_of(**changes)(src, src_lengths, tgt_in)[0].sum().backward()
    with torch.no_grad():
        model_of(**FEEDING)(src, src_lengths, tgt_in)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model_of(**FEEDING)(src, src_lengths, tgt_in)[0].float().sum().backward()
    set_kernels("eager")
    model_of(**FEEDING)(src, src_lengths, tgt_in)[0].sum().backward()
    assert calls == []
