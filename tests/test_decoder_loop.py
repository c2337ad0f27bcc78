"""RNNsearch's teacher-forced loop as one autograd node (nmt.kernels.decoder_loop) gives the numbers and gradients of
the same loop through autograd, step by step, and runs only where it applies."""

import pytest
import torch

import nmt.decoder as decoder_module
import nmt.kernels.decoder_loop as loop_module
from nmt.kernels.compiled import set_kernels
from nmt.loss import token_loss
from nmt.model import ModelConfig, Seq2Seq
from nmt.tokenizer import BOS_ID, PAD_ID


def model_of(**changes) -> Seq2Seq:
    torch.manual_seed(0)
    fields = dict(
        embed_size=16, encoder_hidden_size=12, hidden_size=20, dropout=0.0, attention="bahdanau",
        attention_query="previous", input_feeding=False, decoder_layers=1,
    )  # fmt: skip
    return Seq2Seq(ModelConfig(**{**fields, **changes}), 30, 31)


def batch(tgt_lengths: list[int], seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    src_lengths = ([7, 9, 3, 5, 8] * (len(tgt_lengths) // 5 + 1))[: len(tgt_lengths)]
    B, T = len(tgt_lengths), max(tgt_lengths)
    src = torch.full((B, 9), PAD_ID)
    tgt_in, tgt_out = torch.full((B, T), PAD_ID), torch.full((B, T), PAD_ID)
    for b, (n, m) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[b, :n] = torch.randint(4, 30, (n,), generator=g)
        tgt_out[b, :m] = torch.randint(4, 31, (m,), generator=g)
        tgt_in[b, 0], tgt_in[b, 1:m] = BOS_ID, tgt_out[b, : m - 1]
    return src, torch.tensor(src_lengths), tgt_in, tgt_out


def train_step(model, src, src_lengths, tgt_in, tgt_out, amp: bool):
    """The loss (with a term on the attention weights, so that they get a gradient too), the weights and
    every parameter's gradient."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        logits, weights = model(src, src_lengths, tgt_in)
    loss, n = token_loss(logits.float(), tgt_out)
    g = torch.Generator().manual_seed(7)
    loss = loss / n + (weights * torch.rand(weights.shape, generator=g)).sum()
    loss.backward()
    return loss.detach(), weights.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("tgt_lengths", [[8, 6, 6, 2, 1], [3, 8, 2, 6, 6]], ids=["shrinking", "unsorted"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_the_loop_node_gives_the_autograd_loops_numbers(tgt_lengths, amp, compiled, monkeypatch):
    """The same loss, weights and gradients as the step-by-step loop through autograd on the same kernels,
    on a batch whose sentences leave the loop at different steps (shrinking) or whose rows all stay (not
    sorted longest first); bf16 within its roundings (the state's gradient is added up in fp32 here)."""
    model, data = model_of(), batch(tgt_lengths)
    calls = []
    apply = loop_module._Loop.apply
    monkeypatch.setattr(loop_module._Loop, "apply", lambda *args: calls.append(1) or apply(*args))
    fused = train_step(model, *data, amp)
    assert calls == [1]
    monkeypatch.setattr(decoder_module, "decoder_loop", lambda *args: None)
    loop = train_step(model, *data, amp)
    (loss, weights, grads), (loss_ref, weights_ref, grads_ref) = fused, loop
    tol = dict(rtol=2e-2, atol=2e-3) if amp else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-3 if amp else 1e-6, atol=0)
    torch.testing.assert_close(weights, weights_ref, rtol=0, atol=0)  # the forward is the same arithmetic
    assert set(grads) == set(grads_ref)
    for k, grad in grads_ref.items():
        torch.testing.assert_close(grads[k], grad, **tol, msg=k)
        assert grad.abs().sum() > 0 or k.startswith("encoder.embed"), k  # every gradient reached


@pytest.mark.parametrize(
    "changes",
    [dict(input_feeding=True), dict(decoder_layers=2), dict(attention="luong", attention_options={"score": "concat"})],
    ids=["input-feeding", "two-layers", "luong-concat"],
)
def test_the_loop_node_runs_for_rnnsearch_only(changes, compiled, monkeypatch):
    """Another decoder (input feeding, two layers, another attention with the same keys), a pass without
    gradient and eager kernels take the step-by-step loop."""
    calls = []
    apply = loop_module._Loop.apply
    monkeypatch.setattr(loop_module._Loop, "apply", lambda *args: calls.append(1) or apply(*args))
    src, src_lengths, tgt_in, _ = batch([8, 6, 6, 2])
    model_of(**changes)(src, src_lengths, tgt_in)[0].sum().backward()
    with torch.no_grad():
        model_of()(src, src_lengths, tgt_in)
    set_kernels("eager")
    model_of()(src, src_lengths, tgt_in)[0].sum().backward()
    assert calls == []


def test_luong_concat_steps_get_the_keys_sums_only(compiled):
    """Luong's concat score runs through the additive energy with its own W_s: a training loop hands it the
    keys' sums, not the packed W_s and exp(-2k) that AdditiveAttention's C++ step reads (made per batch,
    unused); its loop still trains every parameter."""
    model = model_of(attention="luong", attention_options={"score": "concat"})
    keys = torch.randn(2, 5, 20, requires_grad=True)
    step_keys, _ = model.decoder.attention.for_steps(keys, torch.randn(2, 5, 24, requires_grad=True), None)
    assert step_keys.query is None and step_keys.exp_keys is None
    src, src_lengths, tgt_in, _ = batch([8, 6, 6, 2])
    model(src, src_lengths, tgt_in)[0].sum().backward()
    assert all(p.grad is not None for p in model.parameters())
