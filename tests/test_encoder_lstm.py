"""The encoder's (bi)LSTM in C++ (nmt.kernels.encoder_lstm) computes nn.LSTM's states and gradients, alone and inside
the Encoder, and steps aside wherever it does not apply; the kernels share their C++ through headers
(nmt.kernels.compiled.source_text)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from nmt.encoder import Encoder
from nmt.kernels import step_gemm
from nmt.kernels.compiled import set_kernels, source_text
from nmt.kernels.encoder_lstm import SOURCE, encoder_lstm


def reference(rnn: torch.nn.LSTM, x: torch.Tensor, grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """nn.LSTM in fp64: [out, h_n, c_n, dx, the parameters' gradients...] for the upstream `grads` (None: unused)."""
    rnn64 = rnn.double()
    x64 = x.detach().double().requires_grad_()
    out, (h, c) = rnn64(x64)
    used = [(t, g.double()) for t, g in zip((out, h, c), grads, strict=True) if g is not None]
    torch.autograd.backward([t for t, _ in used], [g for _, g in used])
    result = [t.detach().clone() for t in (out, h, c, x64.grad, *[p.grad for p in rnn64.parameters()])]
    rnn.float().zero_grad(set_to_none=True)  # the same fp32 values again (fp32 -> fp64 -> fp32 is exact)
    return result


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bi", "uni"])
@pytest.mark.parametrize("B,S,E,H", [(1, 1, 5, 8), (3, 2, 7, 5), (6, 9, 24, 16), (107, 13, 64, 40)])
@pytest.mark.parametrize("used", ["all", "states", "final"])
def test_states_and_gradients_are_nn_lstms(B, S, E, H, bidirectional, used, compiled, kernel_calls):
    """out, (h_n, c_n) and the gradients of x and of every parameter equal nn.LSTM's (fp64) to fp32 accuracy, for
    any rows, steps and sizes (H around a vector and a panel of floats), one or two directions, whichever outputs
    the loss reads (the others' gradients None)."""
    g = torch.Generator().manual_seed(B * 31 + S)
    rnn = torch.nn.LSTM(E, H, batch_first=True, bidirectional=bidirectional)
    x = torch.randn(B, S, E, generator=g).requires_grad_()
    D = 2 if bidirectional else 1
    shapes = [(B, S, D * H), (D, B, H), (D, B, H)]
    grads = [torch.randn(*shape, generator=g) for shape in shapes]
    grads = {"all": grads, "states": [grads[0], None, None], "final": [None, *grads[1:]]}[used]
    expected = reference(rnn, x, grads)

    got = encoder_lstm(rnn, x)
    assert got is not None
    out, (h, c) = got
    used_outputs = [(t, u) for t, u in zip((out, h, c), grads, strict=True) if u is not None]
    torch.autograd.backward([t for t, _ in used_outputs], [u for _, u in used_outputs])
    assert kernel_calls["encoder_lstm.cpp"] == 3  # its panels' width, the forward, the backward
    actual = [out, h, c, x.grad, *[p.grad for p in rnn.parameters()]]
    names = ["out", "h_n", "c_n", "dx", *[n for n, _ in rnn.named_parameters()]]
    for name, a, e in zip(names, actual, expected, strict=True):
        assert a.shape == e.shape, name
        scale = max(float(e.abs().max()), 1.0)
        torch.testing.assert_close(a.double(), e, rtol=0, atol=2e-5 * scale, msg=name)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_thread_or_two_give_the_same_numbers(threads, compiled, kernel_calls):
    """The directions on two threads at once or one after the other: the same arithmetic (the steps' products and
    cells bit for bit; the input's projection is MKL's, whose sums may split differently by thread count)."""
    g = torch.Generator().manual_seed(3)
    rnn = torch.nn.LSTM(16, 24, batch_first=True, bidirectional=True)
    x = torch.randn(20, 7, 16, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = encoder_lstm(rnn, x)
        torch.set_num_threads(threads)
        again = encoder_lstm(rnn, x)
    finally:
        torch.set_num_threads(before)
    assert kernel_calls["encoder_lstm.cpp"] == 3  # the width, and a forward at each count
    for a, b in ((two[0], again[0]), (two[1][0], again[1][0]), (two[1][1], again[1][1])):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_the_encoder_is_the_same_with_the_kernel(compiled, kernel_calls):
    """An Encoder over a batch of two source lengths (the groups of Encoder._by_length) and over one of equal
    lengths gives nn.LSTM's states, final states and gradients with the kernel (dropout off)."""
    torch.manual_seed(0)
    encoder = Encoder(50, 12, 10, bidirectional=True).train()
    for lengths in ([6, 6, 6], [6, 4, 6, 4, 4]):
        src = torch.randint(4, 50, (len(lengths), max(lengths)))
        for row, n in enumerate(lengths):
            src[row, n:] = 0  # PAD_ID
        results = []
        for use_kernel in (False, True):
            set_kernels("compiled" if use_kernel else "eager")
            before = torch.get_num_threads()
            torch.set_num_threads(2)
            try:
                encoder.zero_grad(set_to_none=True)
                enc = encoder(src, torch.tensor(lengths))
                (enc.states.square().sum() + enc.final_h.sum() + 2 * enc.final_c.sum()).backward()
            finally:
                torch.set_num_threads(before)
            results.append([enc.states, enc.final_h, enc.final_c, *[p.grad for p in encoder.parameters()]])
        assert kernel_calls["encoder_lstm.cpp"] > 0
        for eager, kernel in zip(*results, strict=True):
            torch.testing.assert_close(kernel, eager, rtol=1e-5, atol=1e-5)


def test_it_steps_aside_where_it_does_not_apply(compiled):
    """None (nn.LSTM runs) for two layers, a projection, no biases, bf16 or fp64, under autocast, under torch's FLOP
    counter (which counts nn.LSTM's), and with the kernels eager; at any thread count it runs."""
    x = torch.randn(3, 4, 8)
    bi = torch.nn.LSTM(8, 6, batch_first=True, bidirectional=True)
    for rnn in (
        torch.nn.LSTM(8, 6, num_layers=2, batch_first=True, bidirectional=True),
        torch.nn.LSTM(8, 6, proj_size=3, batch_first=True, bidirectional=True),
        torch.nn.LSTM(8, 6, bias=False, batch_first=True, bidirectional=True),
        torch.nn.LSTM(8, 6, batch_first=False, bidirectional=True),
    ):
        assert encoder_lstm(rnn, x) is None
    assert encoder_lstm(bi, x.double()) is None
    assert encoder_lstm(bi.to(torch.bfloat16), x.to(torch.bfloat16)) is None
    bi.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert encoder_lstm(bi, x) is None
    with FlopCounterMode(display=False):
        assert encoder_lstm(bi, x) is None
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert encoder_lstm(bi, x) is not None
            assert encoder_lstm(torch.nn.LSTM(8, 6, batch_first=True), x) is not None  # one direction too
    finally:
        torch.set_num_threads(before)
    set_kernels("eager")
    assert encoder_lstm(bi, x) is None


def test_a_weight_is_packed_for_the_backward_alone(compiled):
    """pack(forward=False): g W's panels only (the encoder's backward), the same as when both are packed."""
    weight = torch.randn(40, 24)
    alone, both = step_gemm.pack(weight, forward=False), step_gemm.pack(weight)
    assert alone.forward is None and torch.equal(alone.backward, both.backward)


def test_sources_take_their_headers_in(tmp_path):
    """source_text replaces `#include "name.h"` lines by the header beside the source (recursively) and leaves
    system includes alone; the encoder's kernel takes both shared headers in."""
    (tmp_path / "inner.h").write_text("int inner;\n")
    (tmp_path / "outer.h").write_text('#include "inner.h"\nint outer;\n')
    (tmp_path / "k.cpp").write_text('#include <vector>\n  #include "outer.h"\nint k;\n')
    assert source_text(tmp_path / "k.cpp") == "#include <vector>\nint inner;\nint outer;\nint k;\n"
    text = source_text(SOURCE)
    assert "static void product(" in text and "static void forward(" in text and '#include "' not in text
