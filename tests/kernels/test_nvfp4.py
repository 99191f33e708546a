"""NVFP4 quantisation against docs/design.md §2.2–2.3: exact cases, bad input, stochastic rounding, properties."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nibble.kernels import nvfp4
from nibble.kernels.codecs import e2m1_decode, unpack_e2m1
from tests.helpers import E2M1_GRID, gap_above, gaussian, heavy_tailed, real_weights, rel_mse

UNIT = 2688.0  # 6 * 448: an amax that makes the standard encode scale exactly 1
UNIT_46 = 1536.0  # 6 * 256: the same with four-over-six


def unit_scale_tensor(block: list[float], unit: float = UNIT) -> torch.Tensor:
    """Two blocks: ``block`` (16 values) and one holding ``unit``, so S = g = 1 exactly."""
    anchor = [unit] + [0.0] * 15
    return torch.tensor([block, anchor], dtype=torch.float32).reshape(1, 32)


def element_values(q: nvfp4.NVFP4Tensor) -> torch.Tensor:
    return e2m1_decode(unpack_e2m1(q.codes))


def test_ties_at_unit_scale_round_to_even_through_quantize():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    block = ties + [-t for t in ties]
    q = nvfp4.quantize(unit_scale_tensor(block))
    assert q.block_scales.float()[0, 0].item() == 1.0 and q.global_scale.item() == 1.0
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]
    assert q.dequantize()[0, :16].tolist() == expected + [-e for e in expected]


def test_zero_signs_follow_te_and_saturation_clamps_to_six():
    # bmax 6.375: the block scale 1.0625 rounds (tie, even) down to 1.0, so 6.375 saturates to 6.
    block = [-0.0, -0.2, 6.375] + [0.0] * 13
    q = nvfp4.quantize(unit_scale_tensor(block))
    out = q.dequantize()[0]
    assert unpack_e2m1(q.codes)[0, :2].tolist() == [0b0000, 0b1000]  # −0.0 → +0; −0.2 → −0
    assert torch.signbit(out[:2]).tolist() == [False, True] and out[:2].abs().sum() == 0
    assert out[2].item() == 6.0


@pytest.mark.parametrize("scale", ["per_tensor", "per_token"])
@pytest.mark.parametrize("four_over_six", [None, "mse", "mae"])
def test_zero_cases_quantise_to_exact_zeros_without_warnings(scale, four_over_six):
    x = gaussian((4, 64))
    x[0] = 0.0  # an all-zero row
    x[1] = 1e-31  # a tiny row: no amax floor, it quantises like any other
    x[2, 16:32] = -0.0  # an all-zero block with negative zeros
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = nvfp4.quantize(x, scale=scale, four_over_six=four_over_six)
        zeros = nvfp4.quantize(torch.zeros(3, 32), scale=scale, four_over_six=four_over_six)
    out = q.dequantize()
    assert torch.isfinite(out).all() and torch.isfinite(q.global_scale).all()
    assert (unpack_e2m1(q.codes)[2, 16:32] == 0).all()  # +0 codes whatever the input signs
    assert (out[2, 16:32] == 0).all() and not torch.signbit(out[2, 16:32]).any()
    assert (out[0] == 0).all()
    if scale == "per_token":
        assert torch.allclose(out[1], x[1], rtol=1e-5, atol=0)  # every element at the row's amax
        assert q.global_scale[0].item() == 2.0**-128  # an all-zero row: S = FLT_MAX (TE)
        assert (q.block_scales.float()[0] == 0).all()
    assert (zeros.dequantize() == 0).all() and (zeros.codes == 0).all()
    assert (zeros.block_scales.float() == 0).all()


def test_four_over_six_exact_tie_keeps_map_to_6():
    # Values on both the map-to-6 grid (scale 1) and the map-to-4 grid (scale 1.5): both errors are 0.
    block = [6.0, 3.0, 1.5, 0.0] * 4
    for metric in ("mse", "mae"):
        q, map_to_4 = nvfp4.quantize_with_choices(unit_scale_tensor(block, UNIT_46), four_over_six=metric)
        assert not map_to_4[0, 0]
        assert q.block_scales.float()[0, 0].item() == 1.0
        assert q.dequantize()[0, :16].tolist() == block


def test_four_over_six_picks_map_to_4_when_values_sit_near_five_sixths_of_the_max():
    # Under scale 1, 5.0 is a tie that rounds to 4 (error 1); under 1.5 it maps to 4.5 (error 0.5).
    block = [6.0] + [5.0] * 15
    for metric in ("mse", "mae"):
        q, map_to_4 = nvfp4.quantize_with_choices(unit_scale_tensor(block, UNIT_46), four_over_six=metric)
        assert map_to_4[0, 0]
        assert q.block_scales.float()[0, 0].item() == 1.5
        assert q.dequantize()[0, :16].tolist() == [6.0] + [4.5] * 15


@pytest.mark.parametrize(
    ("four_over_six", "low", "high"),
    # 4/6's float32 squared error underflows (|d - x| < 2^-63) or overflows (> 2^64) at extreme row
    # magnitudes, where both candidates tie and map-to-6 wins: the spec's formula, kept bit for bit.
    [(None, -90, 100), ("mse", -40, 40), ("mae", -90, 100)],
)
def test_per_token_rows_of_wildly_different_magnitude_quantise_identically(four_over_six, low, high):
    base = gaussian((1, 256), seed=3)
    powers = torch.tensor([[2.0**low], [1.0], [2.0**high]])
    q = nvfp4.quantize(base * powers, scale="per_token", four_over_six=four_over_six)
    assert torch.equal(q.codes[0], q.codes[1]) and torch.equal(q.codes[2], q.codes[1])
    sf = q.block_scales.view(torch.uint8)
    assert torch.equal(sf[0], sf[1]) and torch.equal(sf[2], sf[1])
    assert torch.equal(q.global_scale, q.global_scale[1] * powers[:, 0])
    assert torch.equal(q.dequantize(), q.dequantize()[1:2] * powers)


def test_output_shapes_dtypes_and_nbytes():
    x = gaussian((2, 3, 64), dtype=torch.bfloat16)
    q = nvfp4.quantize(x, scale="per_token")
    assert q.codes.shape == (2, 3, 32) and q.codes.dtype == torch.uint8
    assert q.block_scales.shape == (2, 3, 4) and q.block_scales.dtype == torch.float8_e4m3fn
    assert q.global_scale.shape == (2, 3) and q.global_scale.dtype == torch.float32
    assert q.shape == x.shape and q.dequantize(torch.bfloat16).dtype == torch.bfloat16
    assert q.nbytes == 2 * 3 * 32 + 2 * 3 * 4 + 2 * 3 * 4
    assert nvfp4.quantize(x).global_scale.shape == ()


@pytest.mark.parametrize(
    ("x", "kwargs", "match"),
    [
        (torch.zeros(4, 17), {}, "K=17"),
        (torch.zeros(4, 0), {}, "K=0"),
        (torch.tensor(1.0), {}, "0-dim"),
        (torch.tensor([[float("nan")] + [0.0] * 15]), {}, "NaN"),
        (torch.tensor([[float("inf")] + [0.0] * 15]), {}, "inf"),
        (torch.tensor([[0.0] * 15 + [float("-inf")]]), {}, "inf"),
        (torch.zeros(2, 16, dtype=torch.int32), {}, "dtype torch.int32"),
        (torch.zeros(2, 16, dtype=torch.complex64), {}, "dtype torch.complex64"),
        (torch.zeros(2, 16, dtype=torch.float64), {}, "dtype torch.float64"),
        (torch.zeros(2, 16), {"scale": "per_row"}, "scale='per_row'"),
        (torch.zeros(2, 16), {"four_over_six": "rmse"}, "four_over_six='rmse'"),
        (torch.zeros(2, 16), {"rounding": "down"}, "rounding='down'"),
        (torch.zeros(2, 16), {"rounding": "stochastic"}, "generator"),
        (torch.zeros(2, 16), {"rounding": "stochastic", "four_over_six": "mse"}, "four_over_six"),
        ([1.0] * 16, {}, "torch.Tensor"),
    ],
)
def test_bad_input_raises_value_error_naming_it(x, kwargs, match):
    if kwargs.get("rounding") == "stochastic" and "four_over_six" in kwargs:
        kwargs = {**kwargs, "generator": torch.Generator()}
    with pytest.raises(ValueError, match=match):
        nvfp4.quantize(x, **kwargs)


def test_validate_false_skips_the_finite_check():
    x = torch.tensor([[float("nan")] + [1.0] * 15])
    nvfp4.quantize(x, validate=False)  # the hot path: no sync, no error


# ---- stochastic rounding ------------------------------------------------------------------------


def _stochastic_block(draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.tensor([0.3, -0.3, 1.1, 2.7, -3.2, 4.6, -5.5, 0.05, 6.0, 1.74, 0.0, -2.2, 3.9, 5.01, 0.6, 1.3])
    anchor = torch.zeros(16)
    anchor[0] = UNIT
    x = torch.cat([values.repeat(draws, 1), anchor.unsqueeze(0)]).reshape(1, -1)
    return x, values


def test_stochastic_rounding_is_unbiased():
    draws = 20000
    x, values = _stochastic_block(draws)
    q = nvfp4.quantize(x, rounding="stochastic", generator=torch.Generator().manual_seed(1))
    out = q.dequantize().reshape(-1, 16)[:draws]
    # Each draw is one of two grid points at most 2 apart: std <= 1, so 5 sigma of the mean < 0.036.
    assert (out.mean(0) - values).abs().max() < 5 / draws**0.5


def test_stochastic_rounding_is_reproducible_and_stays_between_neighbours():
    x, values = _stochastic_block(500)
    a = nvfp4.quantize(x, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    b = nvfp4.quantize(x, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    c = nvfp4.quantize(x, rounding="stochastic", generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.codes, b.codes) and not torch.equal(a.codes, c.codes)
    out = a.dequantize().reshape(-1, 16)[:500]
    grid = torch.tensor(E2M1_GRID)
    mag = values.abs()
    lower = grid[(torch.bucketize(mag, grid, right=True) - 1).clamp(max=7)]
    upper = grid[torch.bucketize(mag, grid, right=False).clamp(max=7)]
    assert ((out.abs() == lower) | (out.abs() == upper)).all()
    assert (torch.sign(out) * torch.sign(values) >= 0).all()


# ---- properties ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    leading=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    blocks=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    scale=st.sampled_from(["per_tensor", "per_token"]),
    four_over_six=st.sampled_from([None, "mse", "mae"]),
    log2_magnitude=st.integers(-14, 14),
    heavy=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_error_never_exceeds_half_the_local_grid_step(
    leading, blocks, dtype, scale, four_over_six, log2_magnitude, heavy, seed
):
    shape = (*leading, blocks * 16)
    make = heavy_tailed if heavy else gaussian
    limit = torch.finfo(dtype).max / 2  # keep float16 finite
    x = (make(shape, seed) * 2.0**log2_magnitude).clamp(-limit, limit).to(dtype)
    q = nvfp4.quantize(x, scale=scale, four_over_six=four_over_six)
    assert q.codes.shape == (*leading, blocks * 8) and q.block_scales.shape == (*leading, blocks)
    assert q.global_scale.shape == (tuple(leading) if scale == "per_token" else ())
    if x.numel() == 0:
        return
    xf = x.double().reshape(*leading, blocks, 16)
    sf = q.block_scales.double().unsqueeze(-1)
    g = q.global_scale.double().reshape([*q.global_scale.shape] + [1] * (2 if scale == "per_token" else 0))
    block_scale = sf * g
    err = (q.dequantize().double().reshape(xf.shape) - xf).abs()
    scaled = (xf.abs() / block_scale.clamp(min=1e-300)).clamp(max=6)
    lower_gap = torch.where(scaled <= 2, 0.5, torch.where(scaled <= 4, 1.0, 2.0))
    bound = torch.maximum(gap_above(scaled), lower_gap) / 2 * block_scale
    exempt = (sf == 0) | (sf == 448)  # underflowed or saturated block scales
    ok = (err <= bound * (1 + 1e-6) + 1e-30) | exempt
    assert ok.all()


def test_four_over_six_lowers_relative_mse_on_gaussian_and_real_weights():
    sources = [("gaussian", gaussian((256, 1024), seed=5)), *real_weights(limit=6)]
    for name, x in sources:
        plain = rel_mse(nvfp4.quantize(x).dequantize(), x)
        for metric in ("mse", "mae"):
            adaptive = rel_mse(nvfp4.quantize(x, four_over_six=metric).dequantize(), x)
            print(f"{name}: nvfp4 {plain:.4e}  4/6 {metric} {adaptive:.4e}")
            assert adaptive < plain, name
