"""The quantisers give identical bits on CUDA — the torch reference and the Triton kernels — and on the
CPU reference (docs/design.md §2's contract).

The division and FMA traps of docs/design.md §2 bite on CUDA first; this runs every mode on inputs that
sit on and near rounding ties. Stochastic rounding is excluded: CPU and CUDA generators draw
different streams by design.
"""

import pytest
import torch

from nibble.kernels import mxfp8, nvfp4
from tests.helpers import assert_same_bits, parity_inputs

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", ["per_tensor", "per_token"])
@pytest.mark.parametrize("four_over_six", [None, "mse", "mae"])
def test_nvfp4_is_bit_identical_on_cuda(backend, dtype, scale, four_over_six):
    for name, x in parity_inputs(dtype).items():
        cpu, map_cpu = nvfp4.quantize_with_choices(x, scale=scale, four_over_six=four_over_six)
        gpu, map_gpu = nvfp4.quantize_with_choices(x.cuda(), scale=scale, four_over_six=four_over_six, backend=backend)
        assert_same_bits(cpu.codes, gpu.codes, f"{name} codes")
        assert_same_bits(cpu.block_scales, gpu.block_scales, f"{name} block scales")
        assert_same_bits(cpu.global_scale, gpu.global_scale, f"{name} global scale")
        assert_same_bits(map_cpu, map_gpu, f"{name} map-to-4 choices")
        assert_same_bits(cpu.dequantize(), nvfp4.dequantize(gpu, backend=backend), f"{name} dequantised")


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
