"""The reference quantisers give identical bits on CUDA and on the CPU (DESIGN.md §2's contract).

The division and FMA traps of DESIGN.md §2 bite on CUDA first; this runs every mode on inputs that
sit on and near rounding ties. Stochastic rounding is excluded: CPU and CUDA generators draw
different streams by design.
"""

import pytest
import torch

from nibble.kernels import mxfp8, nvfp4
from tests.helpers import (
    floor_rows,
    four_over_six_near_ties,
    gaussian,
    heavy_tailed,
    map_to_4_scale_order,
    near_midpoints,
    tie_heavy,
)

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def parity_inputs(dtype):
    extreme = gaussian((3, 208), 4) * torch.tensor([[2.0**-30], [1.0], [2.0**12]])
    zero_rows = gaussian((5, 96), 5)
    zero_rows[1] = 0.0
    zero_rows[3] = 1e-31
    cases = {
        "gaussian": gaussian((257, 1024), 1),
        "heavy_tailed": heavy_tailed((129, 2048), 2),
        "ties_448": tie_heavy(64, 512, e=448.0, seed=3),
        "ties_256": tie_heavy(64, 512, e=256.0, seed=4),
        "extreme_rows": extreme,
        "zero_rows": zero_rows,
        "near_midpoints": near_midpoints(256, 5),
        "four_over_six_near_ties": four_over_six_near_ties(2048, 6),
        "map_to_4_scale_order": map_to_4_scale_order(),
        "floor_rows": floor_rows(),
    }
    limit = torch.finfo(dtype).max / 2
    return {name: x.clamp(-limit, limit).to(dtype) for name, x in cases.items()}


def assert_same_bits(cpu: torch.Tensor, cuda: torch.Tensor, what: str) -> None:
    cuda = cuda.cpu()
    if cpu.dtype.is_floating_point and cpu.element_size() == 1:
        cpu, cuda = cpu.view(torch.uint8), cuda.view(torch.uint8)
    elif cpu.dtype == torch.float32:
        cpu, cuda = cpu.view(torch.int32), cuda.view(torch.int32)
    mismatches = int((cpu != cuda).sum())
    assert mismatches == 0, f"{what}: {mismatches} of {cpu.numel()} differ"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", ["per_tensor", "per_token"])
@pytest.mark.parametrize("four_over_six", [None, "mse", "mae"])
def test_nvfp4_reference_is_bit_identical_on_cuda(dtype, scale, four_over_six):
    for name, x in parity_inputs(dtype).items():
        cpu, map_cpu = nvfp4.quantize_with_choices(x, scale=scale, four_over_six=four_over_six)
        gpu, map_gpu = nvfp4.quantize_with_choices(x.cuda(), scale=scale, four_over_six=four_over_six)
        assert_same_bits(cpu.codes, gpu.codes, f"{name} codes")
        assert_same_bits(cpu.block_scales, gpu.block_scales, f"{name} block scales")
        assert_same_bits(cpu.global_scale, gpu.global_scale, f"{name} global scale")
        assert_same_bits(map_cpu, map_gpu, f"{name} map-to-4 choices")
        assert_same_bits(cpu.dequantize(), gpu.dequantize(), f"{name} dequantised")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale_mode", ["rceil", "floor"])
def test_mxfp8_reference_is_bit_identical_on_cuda(dtype, scale_mode):
    for name, x in parity_inputs(dtype).items():
        if x.shape[-1] % 32:
            continue
        cpu = mxfp8.quantize(x, scale_mode=scale_mode)
        gpu = mxfp8.quantize(x.cuda(), scale_mode=scale_mode)
        assert_same_bits(cpu.elements, gpu.elements, f"{name} elements")
        assert_same_bits(cpu.block_scales, gpu.block_scales, f"{name} block scales")
        assert_same_bits(cpu.dequantize(), gpu.dequantize(), f"{name} dequantised")
