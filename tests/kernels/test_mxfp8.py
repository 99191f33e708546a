"""MXFP8 against docs/design.md §2.4: exact exponents, zero blocks, saturation, bad input."""

import pytest
import torch

from nibble.kernels import mxfp8
from tests.helpers import gaussian


def block_with_max(bmax: float) -> torch.Tensor:
    x = torch.zeros(1, 32)
    x[0, 0] = bmax
    return x


def exponent_of(q: mxfp8.MXFP8Tensor) -> int:
    return int(q.block_scales.view(torch.uint8)[0, 0]) - 127


@pytest.mark.parametrize(
    ("bmax", "rceil", "floor"),
    [
        (448.0, 0, 0),  # fits exactly: bmax / 2^0 = 448
        (448.0 * (1 + 2**-23), 1, 0),  # one ulp above 448 needs the next power
        (1.0, -8, -8),  # rceil: 1/2^-8 = 256 <= 448, 1/2^-9 = 512 > 448; floor: 0 - 8
        (2.0**-130, -127, -127),  # subnormal input: exponent clamped at -127
        (3.0e38, 120, 119),  # largest reachable exponents
    ],
)
def test_block_exponents_are_exact(bmax, rceil, floor):
    assert exponent_of(mxfp8.quantize(block_with_max(bmax), scale_mode="rceil")) == rceil
    assert exponent_of(mxfp8.quantize(block_with_max(bmax), scale_mode="floor")) == floor


def test_zero_block_gets_minimum_exponent_and_keeps_negative_zero():
    x = torch.zeros(1, 64)
    x[0, 1] = -0.0
    x[0, 40] = 3.0
    q = mxfp8.quantize(x)
    assert q.block_scales.view(torch.uint8)[0, 0].item() == 0  # e = -127
    out = q.dequantize()
    assert torch.signbit(out[0, 1]) and out[0, 1] == 0 and out[0, 40] == 3.0


def test_floor_mode_saturates_at_448():
    # floor picks e = floor(log2(500)) - 8 = 0, so 500 / 2^0 exceeds 448 and saturates.
    q = mxfp8.quantize(block_with_max(500.0), scale_mode="floor")
    assert q.dequantize()[0, 0].item() == 448.0
    # rceil picks e = 1: 250 rounds to the E4M3 grid point 256 (step 16 in [128, 256)).
    assert mxfp8.quantize(block_with_max(500.0)).dequantize()[0, 0].item() == 512.0


def test_shapes_dtypes_and_error():
    x = gaussian((3, 2, 128), dtype=torch.bfloat16)
    q = mxfp8.quantize(x)
    assert q.elements.shape == x.shape and q.elements.dtype == torch.float8_e4m3fn
    assert q.block_scales.shape == (3, 2, 4) and q.block_scales.dtype == torch.float8_e8m0fnu
    assert q.nbytes == x.numel() + 3 * 2 * 4
    rel = ((q.dequantize() - x.float()).pow(2).sum() / x.float().pow(2).sum()).item()
    assert rel < 2e-3


@pytest.mark.parametrize(
    ("x", "kwargs", "match"),
    [
        (torch.zeros(2, 48), {}, "K=48"),
        (torch.tensor([[float("nan")] + [0.0] * 31]), {}, "NaN"),
        (torch.zeros(2, 32, dtype=torch.int64), {}, "dtype torch.int64"),
        (torch.zeros(2, 32), {"scale_mode": "ceil"}, "scale_mode='ceil'"),
    ],
)
def test_bad_input_raises_value_error_naming_it(x, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mxfp8.quantize(x, **kwargs)
