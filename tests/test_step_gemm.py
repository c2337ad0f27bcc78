"""nmt.kernels.step_gemm: a decoder step's fp32 products through weights packed in panels, against fp64 products."""

from __future__ import annotations

import pytest
import torch

from nmt.kernels import step_gemm
from nmt.kernels.compiled import set_kernels


@pytest.mark.parametrize("out, in_", [(1, 1), (15, 7), (16, 300), (17, 513), (48, 64), (37, 20)])
def test_both_directions_are_the_plain_products_for_any_rows(out, in_, compiled, kernel_calls):
    """x W^T and g W through the panels, for row counts around the register block (6) and none, inner sizes
    past a panel's cached rows (256) and output columns around a panel's width (16 on AVX2, 32 on AVX-512),
    match fp64 products to fp32 rounding (a sum of `in_` products, in another order than mm's)."""
    g = torch.Generator().manual_seed(out * 1000 + in_)
    weight = torch.randn(out, in_, generator=g)
    panels = step_gemm.pack(weight)
    assert panels is not None
    for n in (0, 1, 5, 6, 7, 13, 110, 301):  # 301: three passes of 144 rows (MC)
        x, grad = torch.randn(n, in_, generator=g), torch.randn(n, out, generator=g)
        y = step_gemm.product(x, panels.forward, out, panels.kernel)
        g_x = step_gemm.product(grad, panels.backward, in_, panels.kernel)
        assert y.shape == (n, out) and g_x.shape == (n, in_) and y.dtype == g_x.dtype == torch.float32
        for got, ref, k in ((y, x.double() @ weight.double().t(), in_), (g_x, grad.double() @ weight.double(), out)):
            bound = 4e-7 * k**0.5 * 8  # fp32 rounding of k products of unit normals, with room
            scale = max(ref.abs().max().item(), 1.0) if n else 1.0
            torch.testing.assert_close(got.double(), ref, rtol=0, atol=bound * scale)
    assert kernel_calls["step_gemm.cpp"] > 0


def test_rows_a_stride_apart_and_a_weight_that_is_a_view(compiled, kernel_calls):
    """A step's x is often a view (the first n rows of a wider buffer, [h~; h] joined): rows lda apart are read as
    such; a transposed weight (not contiguous) is packed from its values."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(9, 50, generator=g)
    x = base[:, 5:45]  # (9, 40), rows 50 apart
    weight = torch.randn(40, 24, generator=g).t()  # (24, 40), not contiguous
    panels = step_gemm.pack(weight)
    got = step_gemm.product(x, panels.forward, 24, panels.kernel)
    torch.testing.assert_close(got, x @ weight.t(), rtol=1e-5, atol=1e-5)
    assert kernel_calls["step_gemm.cpp"] > 0


def test_the_forward_only_into_rows_of_a_wider_buffer(compiled, kernel_calls):
    """pack(backward=False) lays out x W^T's panels alone (the output layer's logits); `out` may be the first
    rows and columns of a wider buffer, whose other entries stay as they were."""
    g = torch.Generator().manual_seed(5)
    weight, x = torch.randn(37, 20, generator=g), torch.randn(9, 20, generator=g)
    panels = step_gemm.pack(weight, backward=False)
    assert panels.backward is None
    buffer = torch.full((12, 40), 7.0)
    got = step_gemm.product(x, panels.forward, 37, panels.kernel, out=buffer[:9, :37])
    assert got.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(buffer[:9, :37], x @ weight.t(), rtol=1e-5, atol=1e-5)
    assert (buffer[9:] == 7).all() and (buffer[:, 37:] == 7).all()
    assert kernel_calls["step_gemm.cpp"] > 0


def test_nothing_is_packed_where_the_kernel_does_not_run(compiled):
    """Not fp32, not 2-D, or the kernels eager: None (the steps call F.linear and mm)."""
    assert step_gemm.pack(torch.randn(4, 3, dtype=torch.float64)) is None
    assert step_gemm.pack(torch.randn(4, 3).to(torch.bfloat16)) is None
    assert step_gemm.pack(torch.randn(2, 4, 3)) is None
    assert step_gemm.pack(torch.randn(4, 3)) is not None
    set_kernels("eager")
    assert step_gemm.pack(torch.randn(4, 3)) is None
