"""The fused additive energy (nmt.kernels.energy) computes the plain form's numbers and gradients."""

from dataclasses import replace

import pytest
import torch

import nmt.kernels.compiled as compiled_module
import nmt.kernels.energy as energy
from nmt.device_plan import CPU, imposed
from nmt.errors import ConfigError
from nmt.kernels.compiled import set_kernels
from nmt.kernels.energy import additive_energy


def plain(q, keys, v):
    return torch.tanh(q[:, :, None, :] + keys[:, None, :, :]) @ v  # (B, T, S)


SHAPES = [(3, 1, 5, 7), (4, 6, 9, 8), (2, 3, 700, 600), (5, 1, 700, 600), (7, 2, 31, 16)]


@pytest.fixture
def small_pieces():
    """The energy in pieces of 4,096 elements (nmt.device_plan): many pieces, uneven ones among them."""
    with imposed(replace(CPU.work, energy_elements=4096)):
        yield


@pytest.mark.parametrize("B,T,S,A", SHAPES)
@pytest.mark.parametrize("needs", [(True, True, True), (True, False, True), (False, True, False)])
def test_energy_and_gradients_equal_the_plain_form(B, T, S, A, needs, small_pieces):
    g = torch.Generator().manual_seed(B * 1000 + S)
    q, keys, v = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((B, T, A), (B, S, A), (A,)))
    for x, need in zip((q, keys, v), needs, strict=True):
        x.requires_grad_(need)
    fused, ref = energy._AdditiveEnergy.apply(q, keys, v, None), plain(q, keys, v)
    assert fused.shape == (B, T, S)
    torch.testing.assert_close(fused, ref, rtol=0, atol=1e-12)
    upstream = torch.randn(B, T, S, generator=g, dtype=torch.float64)
    inputs = [x for x in (q, keys, v) if x.requires_grad]
    ours, theirs = torch.autograd.grad(fused, inputs, upstream), torch.autograd.grad(ref, inputs, upstream)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gradcheck():
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in ((2, 3, 4), (2, 5, 4), (4,))]
    assert torch.autograd.gradcheck(lambda q, k, v: energy._AdditiveEnergy.apply(q, k, v, None), args)


def test_fp32_energy_is_close_to_exact_tanh_saturated_inputs_included(small_pieces):
    """The fp32 energy (tanh as 2 sigmoid(2x) - 1) and its gradients stay close to the fp64 plain form, also
    where tanh saturates (|q + k| up to ~60) and where it is near 0."""
    g = torch.Generator().manual_seed(2)
    q, keys = torch.randn(3, 4, 16, generator=g) * 20, torch.randn(3, 9, 16, generator=g) * 20
    keys[0] = -q[0, 0]  # q + k = 0 exactly for the first sentence's first step
    v, upstream = torch.randn(16, generator=g), torch.randn(3, 4, 9, generator=g)
    ours = [x.clone().requires_grad_() for x in (q, keys, v)]
    exact = [x.double().requires_grad_() for x in (q, keys, v)]
    scores, ref = energy._AdditiveEnergy.apply(*ours, None), plain(*exact)
    torch.testing.assert_close(scores.double(), ref, rtol=0, atol=1e-5)
    grads, exact_grads = torch.autograd.grad(scores, ours, upstream), torch.autograd.grad(ref, exact, upstream.double())
    for a, b in zip(grads, exact_grads, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_fp32_under_bf16_autocast():
    """Inputs in bf16 (as autocast's projections give them) are scored in fp32, as the plain fp32 form would."""
    g = torch.Generator().manual_seed(1)
    q, keys = torch.randn(4, 1, 32, generator=g), torch.randn(4, 11, 32, generator=g)
    v = torch.randn(32, generator=g, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = additive_energy(q.bfloat16(), keys.bfloat16(), v)
    assert scores.dtype == torch.float32
    expected = plain(q.bfloat16().float(), keys.bfloat16().float(), v)  # fp32; bf16 would be ~1e-2 off
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5)  # summation order differs by CPU kind
    scores.sum().backward()
    assert v.grad is not None and v.grad.dtype == torch.float32


@pytest.mark.parametrize("B,T,S,A", [(3, 4, 7, 5), (5, 3, 700, 600)])
def test_step_keys_sum_the_keys_gradient_over_steps(B, T, S, A, small_pieces):
    """A decoder loop scores the same keys once per step: with the keys handed over as StepKeys the steps add
    their parts of the keys' gradient in place, giving what autograd's per-step gradients add up to."""
    g = torch.Generator().manual_seed(T * 100 + S)
    keys = torch.randn(B, S, A, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(A, generator=g, dtype=torch.float64, requires_grad=True)
    qs = [torch.randn(B, 1, A, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(T)]
    upstream = [torch.randn(B, 1, S, generator=g, dtype=torch.float64) for _ in range(T)]
    sums = energy._KeySums(keys.shape)
    shared = energy.share(keys, sums.take_gradient)
    ours = sum((energy._AdditiveEnergy.apply(q, shared, v, sums) * u).sum() for q, u in zip(qs, upstream, strict=True))
    ref = sum((plain(q, keys, v) * u).sum() for q, u in zip(qs, upstream, strict=True))
    for a, b in zip(torch.autograd.grad(ours, [keys, v, *qs]), torch.autograd.grad(ref, [keys, v, *qs]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert sums.g_w is None, "the sums are let go once the keys' gradient is formed"


def test_step_keys_are_plain_keys_without_gradients():
    keys = torch.randn(2, 3, 4)
    assert isinstance(energy.StepKeys.of(keys.requires_grad_()), energy.StepKeys)
    with torch.no_grad():
        assert isinstance(energy.StepKeys.of(keys), torch.Tensor)


# ------------------------------------------------------------------------------ compiled kernels (nmt.kernels.compiled)


@pytest.mark.parametrize("B,T,S,A", [(3, 1, 5, 7), (1, 1, 9, 16), (4, 6, 9, 8), (5, 1, 700, 600), (2, 3, 40, 32)])
def test_compiled_energy_and_gradients_equal_the_exact_form(B, T, S, A, compiled, monkeypatch, kernel_calls):
    """The compiled kernels (one step: T = 1, or many) give the fp64 plain form's scores and gradients to fp32
    accuracy, in pieces too."""
    monkeypatch.setattr(energy, "COMPILED_CHUNK_ELEMENTS", 4096)
    g = torch.Generator().manual_seed(B * 100 + T)
    q, keys, v = (torch.randn(*shape, generator=g) for shape in ((B, T, A), (B, S, A), (A,)))
    upstream = torch.randn(B, T, S, generator=g)
    ours = [x.clone().requires_grad_() for x in (q, keys, v)]
    exact = [x.double().requires_grad_() for x in (q, keys, v)]
    scores, ref = additive_energy(*ours), plain(*exact)
    grads, exact_grads = torch.autograd.grad(scores, ours, upstream), torch.autograd.grad(ref, exact, upstream.double())
    for a, b in zip([scores, *grads], [ref, *exact_grads], strict=True):
        # fp32 sums of up to S x A terms, in an order that differs by CPU kind: 1e-5 of the largest value
        # (measured on an AMD EPYC: at most 2e-6 of it, the eager pieces as much; bf16 would be ~1e-2)
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-5 * b.abs().max().item())
    assert sum(kernel_calls.values()) >= 2  # the compiled forward and backward


def test_compiled_step_keys_sum_the_keys_gradient_over_steps(compiled, kernel_calls):
    """A decoder loop's steps, compiled, add their parts of the keys' gradient in place, the first rows only
    where a step scores fewer sentences, as autograd's per-step gradients add up."""
    g = torch.Generator().manual_seed(5)
    B, S, A = 4, 11, 16
    keys, v = torch.randn(B, S, A, generator=g, requires_grad=True), torch.randn(A, generator=g, requires_grad=True)
    rows = [4, 4, 3, 1]  # the sentences still decoded at each step
    qs = [torch.randn(n, 1, A, generator=g, requires_grad=True) for n in rows]
    upstream = [torch.randn(n, 1, S, generator=g) for n in rows]
    step_keys = energy.StepKeys.of(keys)
    ours = sum((additive_energy(q, step_keys.rows(q.size(0)), v) * u).sum() for q, u in zip(qs, upstream, strict=True))
    ref = sum((plain(q, keys[: q.size(0)], v) * u).sum() for q, u in zip(qs, upstream, strict=True))
    for a, b in zip(torch.autograd.grad(ours, [keys, v, *qs]), torch.autograd.grad(ref, [keys, v, *qs]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert sum(kernel_calls.values()) >= 2


def test_compiled_kernels_are_not_used_under_a_dispatch_mode(compiled):
    """torch's FLOP counter (scripts/step_profile.py) runs the eager code: Dynamo cannot trace under it."""
    from torch.utils.flop_counter import FlopCounterMode

    q, keys, v = torch.randn(2, 1, 8, requires_grad=True), torch.randn(2, 5, 8), torch.randn(8)
    with FlopCounterMode(display=False) as counter:
        scores = additive_energy(q, keys, v)
        scores.sum().backward()
    torch.testing.assert_close(scores, plain(q, keys, v), rtol=1e-5, atol=1e-5)
    assert counter.get_total_flops() > 0  # the eager backward's bmm (the compiled kernels show no matmul)


def test_a_failing_compiler_falls_back_to_eager_or_fails_when_insisted_on(monkeypatch, caplog):
    """auto goes on with the eager kernels after one warning; kernels=compiled is a ConfigError that
    names the fix."""

    def broken(*_args, **_kwargs):
        def fails(*_a):
            raise RuntimeError("no C++ compiler")

        return fails

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(compiled_module, "_cache", {})
    monkeypatch.setitem(compiled_module._state, "worked", False)
    monkeypatch.setattr(compiled_module, "has_compiler", lambda: True)
    q, keys, v = torch.randn(2, 1, 8), torch.randn(2, 5, 8), torch.randn(8)
    assert set_kernels("auto", "cpu") == "compiled"
    with caplog.at_level("WARNING"):
        scores = additive_energy(q, keys, v)
    torch.testing.assert_close(scores, plain(q, keys, v), rtol=1e-5, atol=1e-5)
    assert "building a kernel failed" in caplog.text and compiled_module.kernels() == "eager"
    set_kernels("compiled")
    monkeypatch.setattr(compiled_module, "_cache", {})
    with pytest.raises(ConfigError, match="kernels=eager"):
        additive_energy(q, keys, v)


def test_kernel_choices():
    assert set_kernels("auto", "cuda") == "eager"  # unmeasured on CUDA: the eager pieces
    assert set_kernels("eager", "cpu") == "eager"
    assert compiled_module.compiled(plain) is None  # eager: nothing is compiled
    with pytest.raises(ConfigError, match="kernels='fast'"):
        set_kernels("fast")
