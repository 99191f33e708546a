"""Agreement with torchao's NVFP4 and MXFP8 (an implementation nobody here wrote), docs/design.md §2.5.

torchao orders some float32 operations differently (e.g. it divides the block max by the per-tensor
scale where we multiply by its reciprocal), so a block scale can differ by one E4M3 step in rare
blocks: hence ≥ 99.9% identical for float32 and "within one grid step" for bfloat16, not bitwise.
"""

import pytest
import torch
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

from nibble.kernels import mxfp8, nvfp4
from nibble.kernels.codecs import e2m1_decode, unpack_e2m1
from tests.helpers import gap_above, gaussian, heavy_tailed, real_weights


def inputs(dtype):
    sources = [("normal", gaussian((512, 1024), 11)), ("heavy_tailed", heavy_tailed((512, 1024), 12))]
    sources += real_weights(limit=4)
    return [(name, x.to(dtype).contiguous()) for name, x in sources]


def torchao_nvfp4(x):
    scales, packed = nvfp4_quantize(x, 16, per_tensor_amax_to_scale(x.abs().amax().float()))
    return scales, packed.view(torch.uint8)


@pytest.mark.parametrize("source", range(6))
def test_nvfp4_per_tensor_float32_codes_and_scales_match(source):
    name, x = inputs(torch.float32)[source]
    ao_scales, ao_codes = torchao_nvfp4(x)
    q = nvfp4.quantize(x)
    same_scales = (q.block_scales.view(torch.uint8) == ao_scales.view(torch.uint8)).double().mean().item()
    same_codes = (unpack_e2m1(q.codes) == unpack_e2m1(ao_codes)).double().mean().item()
    print(f"{name}: scales {same_scales:.5%} codes {same_codes:.5%} identical")
    assert same_scales >= 0.999 and same_codes >= 0.999, name


@pytest.mark.parametrize("source", range(6))
def test_nvfp4_bfloat16_dequantised_values_within_one_grid_step(source):
    name, x = inputs(torch.bfloat16)[source]
    ao_scales, ao_codes = torchao_nvfp4(x)
    q = nvfp4.quantize(x)
    g = q.global_scale.double()
    ours_v = e2m1_decode(unpack_e2m1(q.codes)).double().reshape(-1, 16)
    ao_v = e2m1_decode(unpack_e2m1(ao_codes)).double().reshape(-1, 16)
    ours_s = q.block_scales.double().reshape(-1, 1) * g
    ao_s = ao_scales.double().reshape(-1, 1) * g
    diff = (ours_v * ours_s - ao_v * ao_s).abs()
    step = torch.maximum(gap_above(ours_v.abs()) * ours_s, gap_above(ao_v.abs()) * ao_s)
    assert (diff <= step * (1 + 1e-9)).all(), name


@pytest.mark.parametrize("scale_mode", ["rceil", "floor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp8_matches(scale_mode, dtype):
    mode = ScaleCalculationMode.RCEIL if scale_mode == "rceil" else ScaleCalculationMode.FLOOR
    for name, x in inputs(dtype):
        ao_scales, ao_elements = to_mx(x, torch.float8_e4m3fn, 32, mode)
        q = mxfp8.quantize(x, scale_mode=scale_mode)
        same_scales = (q.block_scales.view(torch.uint8) == ao_scales.view(torch.uint8)).double().mean().item()
        same_elements = (q.elements.view(torch.uint8) == ao_elements.view(torch.uint8)).double().mean().item()
        print(f"{name} {dtype}: scales {same_scales:.5%} elements {same_elements:.5%} identical")
        assert same_scales >= 0.999 and same_elements >= 0.999, name
