"""StepNumbers.clip is torch's clip_grad_norm_ to the bit, read at once or deferred, and scales no gradient whose
norm is within the bound."""

import pytest
import torch

from nmt.step_numbers import StepNumbers


def parameters(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in [(7, 5), (3,), (11, 2, 4)]]
    for p in params[:2]:  # the last one has no gradient
        p.grad = torch.randn(p.shape, generator=g) * 0.3
    return params


@pytest.mark.parametrize("deferred", [False, True], ids=["read-at-once", "deferred"])
@pytest.mark.parametrize("max_norm", [0.5, 1.0, 100.0])
def test_clip_is_torchs_clip_grad_norm(deferred, max_norm):
    ours, theirs = parameters(3), parameters(3)
    norm = StepNumbers(deferred).clip(iter(ours), max_norm)  # a generator, as model.parameters() is
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    torch.testing.assert_close(norm, expected, rtol=0, atol=0)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_clip_leaves_gradients_within_the_bound_untouched(monkeypatch):
    params = parameters(4)
    before = [p.grad.clone() for p in params[:2]]
    scaled = []
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", lambda *args: scaled.append(args))
    norm = StepNumbers(False).clip(params, 100.0)
    assert float(norm) < 100.0 and scaled == []  # nothing multiplied
    for p, g in zip(params, before, strict=False):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
    StepNumbers(False).clip(params, 0.5)
    assert len(scaled) == 1  # over the bound: scaled


def test_a_gradient_that_is_not_finite_gives_a_norm_that_is_not_finite():
    params = parameters(5)
    params[0].grad[0, 0] = float("inf")
    numbers = StepNumbers(False)
    norm = numbers.clip(params, 1.0)
    assert not torch.isfinite(norm)
    assert not numbers.admit(torch.optim.SGD(params, lr=0.1), torch.tensor(1.0), norm)  # the step is skipped
