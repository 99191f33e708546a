"""Backward modes of the quantised matmul (docs/design.md §3) against their definitions."""

import pytest
import torch

from nibble.kernels import nvfp4
from nibble.recipe import PrecisionPlan, QuantizedMatmul, quantize_weight


def operands(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(24, 64, generator=gen, requires_grad=True)
    w = torch.randn(48, 64, generator=gen, requires_grad=True)
    dy = torch.randn(24, 48, generator=gen)
    return x, w, dy


def run(backward: str, fmt: str = "nvfp4"):
    plan = PrecisionPlan(num_layers=1, backward=backward, bf16_last_fraction=0.0)
    x, w, dy = operands()
    y = QuantizedMatmul.apply(x, w, quantize_weight(w, fmt, plan), fmt, plan)
    y.backward(dy)
    return x, w, dy, y, plan


def test_high_precision_grads_equal_a_plain_linear():
    x, w, dy, _, _ = run("high_precision")
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (x_ref @ w_ref.T).backward(dy)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(w.grad, w_ref.grad)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_dequantized_grads_equal_autograd_through_the_straight_through_operands(fmt):
    x, w, dy, y, plan = run("dequantized", fmt)
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    if fmt == "nvfp4":
        x_dq = nvfp4.quantize(x_ref.detach(), scale="per_token", four_over_six="mse").dequantize()
        w_dq = quantize_weight(w_ref, fmt, plan).dequantize()
    else:
        from nibble.kernels import mxfp8

        x_dq = mxfp8.quantize(x_ref.detach()).dequantize()
        w_dq = quantize_weight(w_ref, fmt, plan).dequantize()
    x_tilde = x_ref + (x_dq - x_ref).detach()
    w_tilde = w_ref + (w_dq - w_ref).detach()
    y_ref = x_tilde @ w_tilde.T
    y_ref.backward(dy)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(w.grad, w_ref.grad)


def test_dequantized_mode_saves_only_packed_codes_and_scales():
    plan = PrecisionPlan(num_layers=1, backward="dequantized")
    x, w, _ = operands()
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        QuantizedMatmul.apply(x, w, quantize_weight(w, "nvfp4", plan), "nvfp4", plan)
    dtypes = sorted(str(t.dtype) for t in saved)
    assert dtypes == ["torch.float32"] * 2 + ["torch.float8_e4m3fn"] * 2 + ["torch.uint8"] * 2
    codes = [t for t in saved if t.dtype == torch.uint8]
    assert {tuple(t.shape) for t in codes} == {(24, 32), (48, 32)}  # packed: K/2 bytes per row
    scales = [t for t in saved if t.dtype == torch.float32]
    assert {tuple(t.shape) for t in scales} == {(24,), ()}  # per-token and per-tensor global scales


def test_quantized_mode_differs_from_dequantized_but_stays_close():
    xd, wd, *_ = run("dequantized")
    xq, wq, *_ = run("quantized")
    assert not torch.equal(xq.grad, xd.grad) and not torch.equal(wq.grad, wd.grad)
    rel = (xq.grad - xd.grad).norm() / xd.grad.norm()
    assert rel < 0.25, rel  # gradient operands carry NVFP4 error too (≈ 10% relative each)
