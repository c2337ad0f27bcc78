"""The hand-written C++ kernels of a decoder step (nmt/kernels/csrc) compute the plain forms' numbers and gradients:
the additive attention's step (nmt.kernels.additive_step: scores v^T tanh(q + k), masked softmax, context) and the
LSTM cell (nmt.kernels.lstm_cell), alone and inside the decoder's loop."""

import pytest
import torch

import nmt.kernels.compiled as compiled_module
from nmt.attention import AdditiveAttention
from nmt.errors import ConfigError
from nmt.kernels.additive_step import RANGE, additive_step, factored_keys
from nmt.kernels.compiled import set_kernels
from nmt.kernels.energy import StepKeys
from nmt.kernels.lstm_cell import lstm_cell
from nmt.kernels.stepweight import StepMatrix
from nmt.loss import token_loss
from nmt.model import ModelConfig, Seq2Seq
from nmt.tokenizer import BOS_ID, PAD_ID


def plain(q, keys, v, values, mask):
    """q (B, A), keys (B, S, A), v (A,), values (B, S, D), mask (B, S) -> context (B, D), weights (B, S)."""
    scores = torch.tanh(q[:, None, :] + keys) @ v  # (B, S)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.bmm(weights[:, None, :], values)[:, 0], weights


def random_step(B, S, A, D, seed, lengths=None):
    g = torch.Generator().manual_seed(seed)
    q, keys = torch.randn(B, A, generator=g), torch.randn(B, S, A, generator=g)
    values = torch.randn(B, S, D, generator=g)
    v = torch.randn(A, generator=g) / A**0.5  # scores of a few units, as in training
    mask = torch.arange(S)[None, :] < torch.tensor(lengths or [S] * B)[:, None]
    return q, keys, v, values, mask


# A and D below, at and above one vector of floats (8 with AVX2, 16 with AVX-512), the study's 256, and padding
SHAPES = [
    (3, 5, 7, 5, [5, 2, 4]),
    (1, 9, 16, 16, None),
    (4, 40, 33, 70, [40, 1, 17, 39]),
    (2, 130, 256, 256, [130, 90]),
]


def step_keys(keys: torch.Tensor, factored: bool):
    """The keys as a training loop hands them to its steps: StepKeys (their gradient summed over the steps),
    with exp(-2 k) for the factored sigmoid when `factored`."""
    keys = StepKeys.of(keys, None, factored_keys if factored else None)
    assert isinstance(keys, StepKeys) and (keys.exp_keys is not None) == factored
    return keys


@pytest.mark.parametrize("factored", [False, True], ids=["exp per element", "factored"])
@pytest.mark.parametrize("B,S,A,D,lengths", SHAPES)
def test_step_and_gradients_equal_the_exact_form(B, S, A, D, lengths, factored, compiled, kernel_calls):
    """Context, weights and the gradients of q, keys, v and values (through the context and the weights) are
    the fp64 plain form's to fp32 accuracy, with the sigmoids from an exp per element (plain keys) or factored
    (a loop's keys with exp(-2 k)); padding gets exactly zero weight."""
    inputs = random_step(B, S, A, D, seed=B * 100 + S, lengths=lengths)
    mask = inputs[-1]
    ours = [x.clone().requires_grad_() for x in inputs[:4]]
    exact = [x.double().requires_grad_() for x in inputs[:4]]
    context, weights = additive_step(ours[0], step_keys(ours[1], True) if factored else ours[1], *ours[2:], mask)
    ref_context, ref_weights = plain(*exact, mask)
    assert (weights[~mask] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B))
    g = torch.Generator().manual_seed(1)
    up_context, up_weights = torch.randn(B, D, generator=g), torch.randn(B, S, generator=g)
    loss = (context * up_context).sum() + (weights * up_weights).sum()
    ref_loss = (ref_context * up_context.double()).sum() + (ref_weights * up_weights.double()).sum()
    grads, ref_grads = torch.autograd.grad(loss, ours), torch.autograd.grad(ref_loss, exact)
    for a, b in zip([context, weights, *grads], [ref_context, ref_weights, *ref_grads], strict=True):
        # fp32 sums and torch's fast exp (20 ulp): 1e-5 of the largest value (measured: at most 1e-6 of it)
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-5 * b.abs().max().item())
    assert kernel_calls["additive_step.cpp"] >= 2  # the forward and the backward ran in C++


def test_bf16_values_read_and_written_in_bf16(compiled, kernel_calls):
    """Under bf16 autocast the values (and the context) are bf16 (nmt.device.step_dtype): the context is the
    plain form's on the same bf16 values, rounded once to bf16."""
    q, keys, v, values, mask = random_step(3, 21, 24, 40, seed=7, lengths=[21, 9, 15])
    values = values.bfloat16()
    context, weights = additive_step(q, keys, v, values.requires_grad_(), mask)
    ref_context, ref_weights = plain(q.double(), keys.double(), v.double(), values.double(), mask)
    assert context.dtype == torch.bfloat16 and weights.dtype == torch.float32
    torch.testing.assert_close(weights.double(), ref_weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(context.double(), ref_context, rtol=2**-8, atol=1e-6)  # one bf16 rounding
    (grad,) = torch.autograd.grad(context.float().sum(), values)
    assert grad.dtype == torch.bfloat16 and (grad[~mask] == 0).all()
    assert kernel_calls["additive_step.cpp"] > 0


@pytest.mark.parametrize("factored", [False, True], ids=["exp per element", "factored"])
def test_a_loop_sums_the_keys_and_values_gradients_over_its_steps(factored, compiled, kernel_calls):
    """In a decoder loop (StepKeys, StepMatrix; fewer sentences at later steps) every step adds its share of
    the keys' and values' gradients: the same as autograd's per-step gradients of the plain form (factored: with
    queries far beyond the keys' range in some rows, one factor near overflow, the other near underflow)."""
    B, S, A, D = 4, 11, 16, 12
    _, keys, v, values, mask = random_step(B, S, A, D, seed=3, lengths=[11, 11, 6, 3])
    g = torch.Generator().manual_seed(4)
    rows = [4, 4, 3, 1]  # the sentences still decoded at each step
    qs = [torch.randn(n, A, generator=g) for n in rows]
    qs[1][2] *= 2.15 * RANGE / qs[1][2].abs().max()  # exp(-2 q) near fp32's largest or smallest floats
    qs[2][0] *= 3 * RANGE / qs[2][0].abs().max()  # and beyond: inf or 0
    up = [torch.randn(n, D, generator=g) for n in rows]
    leaves = [x.clone().requires_grad_() for x in (keys, v, values, *qs)]
    keys_, step_values = step_keys(leaves[0], factored), StepMatrix.of(leaves[2], None)
    loss = sum(
        (additive_step(q, keys_.rows(len(q)), leaves[1], step_values.rows(len(q)), mask[: len(q)])[0] * u).sum()
        for q, u in zip(leaves[3:], up, strict=True)
    )
    exact = [x.double().requires_grad_() for x in (keys, v, values, *qs)]
    ref = sum(
        (plain(q, exact[0][: len(q)], exact[1], exact[2][: len(q)], mask[: len(q)])[0] * u.double()).sum()
        for q, u in zip(exact[3:], up, strict=True)
    )
    for a, b in zip(torch.autograd.grad(loss, leaves), torch.autograd.grad(ref, exact), strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-5 * b.abs().max().item())
    assert kernel_calls["additive_step.cpp"] > 0


def rnnsearch(input_feeding: bool, layers: int, self_attention_layers: int = 0) -> Seq2Seq:
    torch.manual_seed(0)
    config = ModelConfig(
        embed_size=16, encoder_hidden_size=12, hidden_size=20, dropout=0.0, attention="bahdanau",
        attention_query="previous", input_feeding=input_feeding, decoder_layers=layers,
        self_attention_layers=self_attention_layers,
    )  # fmt: skip
    return Seq2Seq(config, 30, 31)


@pytest.mark.parametrize(
    "input_feeding, layers, self_attention",
    [(False, 1, 0), (True, 1, 0), (False, 2, 0), (True, 1, 1)],
    ids=["nofeed", "feed", "deep", "selfattention"],
)
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_training_step_equals_the_eager_kernels(input_feeding, layers, self_attention, amp, compiled, kernel_calls):
    """RNNsearch's teacher-forced loop on the C++ attention step and LSTM cells: the loss, the weights and
    every gradient of the eager (torch) loop, on a batch whose targets end at different steps (with a block of
    self-attention over the encoder states too: model.self_attention_layers=1)."""
    model = rnnsearch(input_feeding, layers, self_attention)
    g = torch.Generator().manual_seed(5)
    src_lengths, tgt_lengths = [7, 9, 3, 5], [8, 6, 6, 2]  # targets longest first (the sampler's order)
    src = torch.full((4, 9), PAD_ID)
    tgt_in, tgt_out = torch.full((4, 8), PAD_ID), torch.full((4, 8), PAD_ID)
    for b, (n, m) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[b, :n] = torch.randint(4, 30, (n,), generator=g)
        tgt_out[b, :m] = torch.randint(4, 31, (m,), generator=g)
        tgt_in[b, 0], tgt_in[b, 1:m] = BOS_ID, tgt_out[b, : m - 1]
    results = []
    for kernels in ("compiled", "eager"):
        set_kernels(kernels)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits, weights = model(src, torch.tensor(src_lengths), tgt_in)
        loss, n = token_loss(logits.float(), tgt_out)
        (loss / n).backward()
        results.append((loss.detach(), weights.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    (loss, weights, grads), (loss_ref, weights_ref, grads_ref) = results
    tol = dict(rtol=2e-2, atol=2e-3) if amp else dict(rtol=1e-4, atol=1e-6)  # bf16: rounded in other places
    torch.testing.assert_close(loss, loss_ref, rtol=1e-3 if amp else 1e-5, atol=0)
    torch.testing.assert_close(weights, weights_ref, **tol)
    for k, grad in grads_ref.items():
        torch.testing.assert_close(grads[k], grad, **tol, msg=k)
    assert kernel_calls["lstm_cell.cpp"] > 0


def test_the_factored_form_needs_keys_in_range_and_the_kernel(compiled):
    """exp(-2 k) is handed to the kernel only where every |k| <= RANGE (the products of the factored sigmoid
    stay normal floats), and only where the kernel runs."""
    keys = torch.randn(2, 5, 8)
    torch.testing.assert_close(factored_keys(keys), torch.exp(-2 * keys))
    keys[1, 3, 2] = -1.01 * RANGE
    assert factored_keys(keys) is None
    assert factored_keys(torch.full((1, 2, 3), float("nan"))) is None
    set_kernels("eager")
    assert factored_keys(torch.randn(2, 5, 8)) is None


def test_the_step_runs_only_where_the_kernels_are_compiled(compiled):
    """Eager kernels, torch's FLOP counter (a dispatch mode) or values of another dtype: None, and the
    attention computes the step with torch operations."""
    from torch.utils.flop_counter import FlopCounterMode

    q, keys, v, values, mask = random_step(2, 5, 8, 6, seed=2)
    assert additive_step(q, keys, v, values.double(), mask) is None
    with FlopCounterMode(display=False):
        assert additive_step(q, keys, v, values, mask) is None
    set_kernels("eager")
    assert additive_step(q, keys, v, values, mask) is None
    attention = AdditiveAttention(8, 6, 8)
    context, weights = attention(q[:, None, :], keys, values, mask)
    assert context.shape == (2, 1, 6) and weights.shape == (2, 1, 5)


def test_a_failing_build_falls_back_to_the_torch_step_or_fails_when_insisted_on(monkeypatch, caplog):
    """As a failed torch.compile (nmt.kernels.compiled): auto warns once and goes on with torch operations;
    kernels=compiled is a ConfigError that names the fix."""
    from torch._inductor import codecache

    def broken(*_args, **_kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(codecache.CppPythonBindingsCodeCache, "load_pybinding", broken)
    monkeypatch.setattr(compiled_module, "_cache", {})
    monkeypatch.setattr(compiled_module, "_load_built", lambda *_args: None)  # as on a machine that built none
    monkeypatch.setattr(compiled_module, "has_compiler", lambda: True)
    q, keys, v, values, mask = random_step(2, 5, 8, 6, seed=2)
    assert set_kernels("auto", "cpu") == "compiled"
    with caplog.at_level("WARNING"):
        assert additive_step(q, keys, v, values, mask) is None
    assert "building a kernel failed" in caplog.text and compiled_module.kernels() == "eager"
    set_kernels("compiled")
    with pytest.raises(ConfigError, match="kernels=eager"):
        additive_step(q, keys, v, values, mask)


def plain_cell(x0, wx, c):
    i, f, g, o = (x0 + wx).chunk(4, dim=-1)
    cell = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(cell), cell


@pytest.mark.parametrize("H", [3, 16, 37, 256])
@pytest.mark.parametrize("x0_kind", ["strided", "bias"])
def test_lstm_cell_and_gradients_equal_the_exact_form(H, x0_kind, compiled, kernel_calls):
    """h and the new cell, and the gradients of x0 (a strided view of the embeddings' projection for all
    steps, or the bias of a layer above the first), wx and c: the fp64 form's to fp32 accuracy."""
    g = torch.Generator().manual_seed(H)
    B = 5
    all_steps = torch.randn(B, 3, 4 * H, generator=g, requires_grad=True)  # (B, T, 4H), as in the loop
    bias = torch.randn(4 * H, generator=g, requires_grad=True)
    wx = torch.randn(B, 4 * H, generator=g, requires_grad=True)
    c = torch.randn(B, H, generator=g, requires_grad=True)
    leaf = all_steps if x0_kind == "strided" else bias
    h, cell = lstm_cell(all_steps[:, 1] if x0_kind == "strided" else bias, wx, c)  # step 1: a strided view
    exact = [x.detach().double().requires_grad_() for x in (all_steps[:, 1] if x0_kind == "strided" else bias, wx, c)]
    ref_h, ref_cell = plain_cell(*exact)
    up_h, up_cell = torch.randn(B, H, generator=g), torch.randn(B, H, generator=g)
    grads = torch.autograd.grad((h * up_h).sum() + (cell * up_cell).sum(), [leaf, wx, c])
    ref_grads = torch.autograd.grad((ref_h * up_h.double()).sum() + (ref_cell * up_cell.double()).sum(), exact)
    grad_x0 = grads[0]
    if x0_kind == "strided":
        assert (grad_x0[:, [0, 2]] == 0).all()  # the other steps' rows get nothing
        grad_x0 = grad_x0[:, 1]
    for a, b in zip([h, cell, grad_x0, *grads[1:]], [ref_h, ref_cell, *ref_grads], strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-6 * max(1.0, b.abs().max().item()))
    assert kernel_calls["lstm_cell.cpp"] >= 2


def test_lstm_cell_in_bf16_keeps_the_cell_in_fp32(compiled, kernel_calls):
    """Under bf16 autocast wx (W_r's product) is bf16: h comes out in bf16 (the next matmul's input), the
    cell in fp32 (it accumulates over every step), both the plain form's on the same inputs."""
    g = torch.Generator().manual_seed(0)
    x0, wx, c = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g).bfloat16(), torch.randn(4, 16)
    h, cell = lstm_cell(x0, wx, c)
    ref_h, ref_cell = plain_cell(x0.double(), wx.double(), c.double())
    assert h.dtype == torch.bfloat16 and cell.dtype == torch.float32
    torch.testing.assert_close(cell.double(), ref_cell, rtol=0, atol=1e-6)
    torch.testing.assert_close(h.double(), ref_h, rtol=2**-8, atol=1e-6)  # one bf16 rounding
    assert kernel_calls["lstm_cell.cpp"] > 0


def test_lstm_cell_saturates_as_fp64_and_keeps_nan(compiled, kernel_calls):
    """Pre-activations far out (to +-200, past where exp overflows in fp32: the cell's exp clamps there) give the
    saturated gates fp64 gives, and a NaN in one pre-activation reaches that unit's h and cell, not a number the
    clamp made of it; the other rows stay finite."""
    H = 16
    x0, wx = torch.linspace(-200, 200, 3 * 4 * H).view(3, 4 * H), torch.zeros(3, 4 * H)
    c = torch.randn(3, H, generator=torch.Generator().manual_seed(0))
    h, cell = lstm_cell(x0, wx, c)
    ref_h, ref_cell = plain_cell(x0.double(), wx.double(), c.double())
    torch.testing.assert_close(h.double(), ref_h, rtol=0, atol=1e-6)
    torch.testing.assert_close(cell.double(), ref_cell, rtol=0, atol=1e-6)
    x0[1, 5] = float("nan")  # gate i of unit 5, row 1
    h, cell = lstm_cell(x0, wx, c)
    assert h[1, 5].isnan() and cell[1, 5].isnan()
    assert h[[0, 2]].isfinite().all() and cell[[0, 2]].isfinite().all()
    assert kernel_calls["lstm_cell.cpp"] > 0


def test_step_by_step_decoding_equals_teacher_forcing_on_the_kernels(compiled, kernel_calls):
    """Search's single step (no gradient, plain keys and values) on the C++ kernels gives the teacher-forced
    loop's logits and weights, as the torch step does."""
    model = rnnsearch(input_feeding=False, layers=1).eval()
    src = torch.randint(4, 30, (3, 7))
    src[1, 5:] = PAD_ID
    lengths, tgt_in = torch.tensor([7, 5, 7]), torch.randint(4, 31, (3, 6))
    with torch.no_grad():
        logits, weights = model(src, lengths, tgt_in)
        enc, keys, values, state = model.encode(src, lengths)
        steps = []
        for t in range(tgt_in.size(1)):
            out, state, w = model.decoder.step(tgt_in[:, t], state, keys, values, enc.mask)
            steps.append((out, w))
    torch.testing.assert_close(torch.stack([o for o, _ in steps], 1), logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.stack([w for _, w in steps], 1), weights, rtol=0, atol=1e-6)
    assert (weights[1, :, 5:] == 0).all()
    assert kernel_calls["additive_step.cpp"] > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_packed_step_weights_give_the_plain_products_and_gradients(dtype, compiled, kernel_calls):
    """A step weight packed where step_products runs (fp32: in nmt.kernels.step_gemm's panels; bf16: for oneDNN,
    on a CPU with bf16 hardware): x W^T and the input gradient g W of steps with any number of rows, and the
    weight's gradient summed over them, are the plain products'."""
    import torch.nn.functional as F

    from nmt.kernels.step_gemm import Panels
    from nmt.kernels.stepweight import Packed, StepWeight
    from nmt.precision import native_bf16

    g = torch.Generator().manual_seed(8)
    weight = torch.randn(24, 40, generator=g).to(dtype).requires_grad_()
    xs = [torch.randn(n, 40, generator=g).to(dtype).requires_grad_() for n in (7, 32, 33, 1)]
    step = StepWeight.of(weight, None)
    packs = dtype == torch.float32 or native_bf16("cpu")  # oneDNN packs bf16 only on bf16 hardware (AVX-512 BF16)
    assert isinstance(step.packed, Panels if dtype == torch.float32 else Packed) if packs else step.packed is None
    ours = sum((step(x).float() * (i + 1)).sum() for i, x in enumerate(xs))
    grads = torch.autograd.grad(ours, [weight, *xs])
    if dtype == torch.float32:
        assert kernel_calls["step_gemm.cpp"] >= 1 + 2 * len(xs)  # the packing, every product both ways
    exact = [t.detach().double().requires_grad_() for t in (weight, *xs)]  # the same values, in fp64
    plain = sum((F.linear(x, exact[0]) * (i + 1)).sum() for i, x in enumerate(exact[1:]))
    ref = torch.autograd.grad(plain, exact)
    scale = 1e-5 if dtype == torch.float32 else 2**-7  # bf16: products and gradients rounded to bf16
    torch.testing.assert_close(ours.double(), plain, rtol=scale, atol=0)
    for a, b in zip(grads, ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=scale * b.abs().max().item())
    set_kernels("eager")
    assert StepWeight.of(weight, None).packed is None  # eager kernels: F.linear and mm


def test_packing_turns_off_where_onednn_refuses(monkeypatch, compiled):
    """A torch whose oneDNN refuses to pack a bf16 weight (or has moved the op): the plain products, for the rest
    of the process, and the same numbers."""
    import nmt.kernels.stepweight as stepweight

    def refuse(weight):
        raise RuntimeError("no packing here")

    monkeypatch.setitem(stepweight._PACKING, "works", True)
    monkeypatch.setattr(stepweight, "native_bf16", lambda device_type: True)
    monkeypatch.setattr(stepweight, "_reorder", refuse)
    weight = torch.randn(6, 5).bfloat16().requires_grad_()
    step = stepweight.StepWeight.of(weight, None)
    assert step.packed is None and not stepweight._PACKING["works"]
    x = torch.randn(3, 5).bfloat16()
    torch.testing.assert_close(step(x), x @ weight.t())
