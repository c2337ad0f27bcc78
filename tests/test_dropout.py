"""nmt/dropout.py: the cheaper CPU mask behaves as dropout (rate, scale, gradient, seeding, eval)."""

from __future__ import annotations

import pytest
import torch

from nmt.dropout import Dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.2, 0.3, 0.5])
def test_the_drop_rate_and_the_scale(p):
    torch.manual_seed(0)
    mask = keep_mask((1000, 1000), p, torch.float32)
    kept = mask > 0
    values = mask.unique().tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / (1 - p))
    assert abs(kept.float().mean().item() - (1 - p)) < 0.003  # 1e6 draws: 6 standard deviations
    assert abs(mask.mean().item() - 1.0) < 0.005  # the expectation is kept


def test_masks_are_independent_across_positions_and_calls():
    torch.manual_seed(0)
    a = keep_mask((200_000,), 0.5, torch.float32) > 0
    b = keep_mask((200_000,), 0.5, torch.float32) > 0
    # neighbours share a 64-bit draw; they must still be independent: P(both kept) = 1/4 for p = 0.5
    assert abs((a[:-1] & a[1:]).float().mean().item() - 0.25) < 0.005
    assert abs((a & b).float().mean().item() - 0.25) < 0.005


def test_forward_and_gradient_use_one_mask():
    torch.manual_seed(1)
    x = torch.randn(64, 33, requires_grad=True)
    y = Dropout(0.3).train()(x)
    y.sum().backward()
    dropped = y == 0
    assert 0.2 < dropped.float().mean().item() < 0.4
    torch.testing.assert_close(y[~dropped], x[~dropped] / 0.7)
    torch.testing.assert_close(x.grad, torch.where(dropped, 0.0, 1 / 0.7))


def test_seeded_runs_repeat_and_eval_is_the_identity():
    d, x = Dropout(0.2), torch.randn(8, 100)
    torch.manual_seed(3)
    first = d.train()(x)
    torch.manual_seed(3)
    assert torch.equal(first, d(x))
    assert d.eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)


def test_bf16_input_stays_bf16():
    x = torch.randn(16, 16).bfloat16()
    assert Dropout(0.2).train()(x).dtype == torch.bfloat16


def test_mask_is_the_draw_forward_multiplies_by():
    """Dropout.mask, for code that applies the mask itself (nmt.kernels.feed_loop), takes the same draw from the
    same seed as forward, and is None wherever forward is the identity."""
    d, x = Dropout(0.25).train(), torch.randn(7, 50)
    torch.manual_seed(4)
    y = d(x)
    torch.manual_seed(4)
    assert torch.equal(y, x * d.mask((7, 50), torch.float32))
    assert d.eval().mask((7, 50), torch.float32) is None
    assert Dropout(0.0).train().mask((7, 50), torch.float32) is None


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_the_compiled_mask_is_torchs_and_draws_as_much(p, compiled, kernel_calls):
    """Where the compiled kernels run, keep_mask's C++ pass (nmt.kernels.keep_mask) gives the torch operations'
    mask bit for bit, for sizes around its blocks of 4 words (12 elements), a thread's chunk (24,576) and the
    size from which it takes both threads (2^18), and leaves torch's generator where they leave it."""
    from nmt.kernels.compiled import set_kernels
    from nmt.kernels.keep_mask import keep_mask_from

    # the kernel runs here (three zero fields against threshold 0: all kept)
    assert torch.equal(keep_mask_from(torch.zeros(1, dtype=torch.int64), 3, 0, 2.0), torch.full((3,), 2.0))
    for shape in [(0,), (1,), (2,), (3,), (11,), (12,), (13,), (107, 512), (24_577,), (3, 87_382), (1 << 18) + 5]:
        shape = shape if isinstance(shape, tuple) else (shape,)
        torch.manual_seed(7)
        compiled_mask, compiled_next = keep_mask(shape, p, torch.float32), torch.rand(())
        set_kernels("eager")
        torch.manual_seed(7)
        eager_mask, eager_next = keep_mask(shape, p, torch.float32), torch.rand(())
        set_kernels("compiled")
        assert compiled_mask.shape == shape and compiled_mask.dtype == torch.float32
        assert torch.equal(compiled_mask, eager_mask), shape
        assert torch.equal(compiled_next, eager_next)  # the same number of draws
    assert kernel_calls["keep_mask.cpp"] > 0
