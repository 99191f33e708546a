"""The packed NVFP4 GEMM's variants (kernels/gpu/gemm.py ``VARIANTS``): the weight decode against the E2M1 and
E4M3 definitions, the inline-PTX decode against the pure-Triton one bit for bit, and each variant's rows the
same bits whatever the row count (the row-invariance contract, kernels/gpu/row_invariance.py).

On the CPU the pure-Triton decode runs under the Triton interpreter; the ``gpu`` tests run on the H200:

    python -m pytest -m gpu tests/kernels/test_nvfp4_gemm_variants.py tests/kernels/test_triton_kernels.py -q
"""

import pytest
import torch

from nibble.kernels import nvfp4
from nibble.kernels.tensors import NVFP4Tensor
from tests.helpers import gaussian, heavy_tailed

triton = pytest.importorskip("triton", reason="the triton package is not installed")
import triton.language as tl  # noqa: E402

from nibble.kernels.gpu import gemm as gpu_gemm  # noqa: E402
from nibble.kernels.gpu.nvfp4_gemm import decode_weights  # noqa: E402
from nibble.kernels.gpu.nvfp4_quantize import e4m3_decode  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# E2M1 by code (docs/design.md): bit 3 is the sign, bits 0-2 index the magnitudes
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = E2M1 + tuple(-v for v in E2M1)


@triton.jit
def _decode_kernel(codes_ptr, scales_ptr, low_ptr, high_ptr, ASM_DECODE: tl.constexpr):
    """Decode a ``[64, 4, 8]`` tile of packed bytes with one scale byte per row of 8 (as the GEMM does)."""
    i = tl.arange(0, 64)[:, None, None] * 32 + tl.arange(0, 4)[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    s = tl.arange(0, 64)[:, None] * 4 + tl.arange(0, 4)[None, :]
    scale = e4m3_decode(tl.load(scales_ptr + s)).to(tl.float16)
    low, high = decode_weights(tl.load(codes_ptr + i), scale[:, :, None], ASM_DECODE)
    tl.store(low_ptr + i, low)
    tl.store(high_ptr + i, high)


def _decode(codes: torch.Tensor, scales: torch.Tensor, asm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    low = torch.empty(codes.shape, dtype=torch.float16, device=codes.device)
    high = torch.empty_like(low)
    _decode_kernel[(1,)](codes, scales.view(torch.uint8), low, high, ASM_DECODE=asm)
    return low, high


def _all_bytes_and_scales() -> tuple[torch.Tensor, torch.Tensor]:
    """Every packed byte 8 times over (2048 bytes) and 256 E4M3 scales: the extremes and random finite ones."""
    codes = torch.arange(256, dtype=torch.int32).repeat(8).to(torch.uint8)
    gen = torch.Generator().manual_seed(0)
    fixed = torch.tensor([0x01, 0x07, 0x08, 0x38, 0x7E], dtype=torch.uint8)  # 2^-9, 7*2^-9, 2^-6, 1, 448
    finite = torch.randint(0, 0x7F, (256 - fixed.numel(),), generator=gen).to(torch.uint8)
    scales = torch.cat([fixed, finite]).view(torch.float8_e4m3fn)
    return codes.to(DEVICE), scales.to(DEVICE)


def test_decode_is_e2m1_times_the_block_scale():
    codes, scales = _all_bytes_and_scales()
    low, high = _decode(codes, scales, asm=False)
    values = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    c = codes.cpu().long()
    scale = scales.cpu().to(torch.float64).repeat_interleave(8) * 2.0**-14
    assert torch.equal(low.cpu().double(), values[c & 15] * scale)
    assert torch.equal(high.cpu().double(), values[c >> 4] * scale)


@pytest.mark.gpu
def test_inline_ptx_decode_gives_the_same_bits_as_the_triton_one():
    codes, scales = _all_bytes_and_scales()
    for asm_half, triton_half in zip(_decode(codes, scales, asm=True), _decode(codes, scales, asm=False), strict=True):
        assert torch.equal(asm_half.view(torch.int16), triton_half.view(torch.int16))


def test_the_inline_ptx_decode_is_refused_off_cuda():
    if CUDA:
        pytest.skip("CUDA runs the PTX")
    qx = nvfp4.quantize(gaussian((2, 32)), scale="per_token")
    qw = nvfp4.quantize(gaussian((32, 32), 1), scale="per_tensor")
    with pytest.raises(ValueError, match="CUDA only"):
        gpu_gemm.packed_matmul(qx, qw, torch.float32, variant=gpu_gemm.Variant(32, 64, 1, True))


def _operands(m: int, n: int, k: int, seed: int) -> tuple[NVFP4Tensor, NVFP4Tensor, torch.Tensor]:
    x = heavy_tailed((m, k), seed).to(DEVICE)
    x[3] = 0  # an all-zero row
    qx = nvfp4.quantize(x, scale="per_token", four_over_six="mse")
    qw = nvfp4.quantize(gaussian((n, k), seed + 1).to(DEVICE).to(torch.bfloat16), scale="per_tensor")
    ref = qx.dequantize(torch.float64).cpu() @ qw.dequantize(torch.float64).cpu().T
    return qx, qw, ref


def _rows(qx: NVFP4Tensor, m: int) -> NVFP4Tensor:
    return NVFP4Tensor(qx.codes[:m], qx.block_scales[:m], qx.global_scale[:m], True, (m, qx.shape[1]))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", gpu_gemm.VARIANTS, ids=lambda v: v.name)
def test_each_variant_keeps_every_rows_bits_at_every_row_count(variant):
    """Rows 0..m-1 of an m-row product equal those of the 1200-row one, for every row tile the table uses;
    the product is within 1e-4 of float64; and the decoders agree (pure Triton vs inline PTX)."""
    k = 4112  # 257 blocks of 16: K split in 4 (at these 392 columns), the last split and K step partial
    qx, qw, ref = _operands(1200, 392, k, 7)
    full = gpu_gemm.packed_matmul(qx, qw, torch.float32, variant=variant)
    assert float((full.double().cpu() - ref).norm() / ref.norm()) < 1e-4
    for m in (1, 5, 16, 17, 64, 65, 300):
        assert torch.equal(gpu_gemm.packed_matmul(_rows(qx, m), qw, torch.float32, variant=variant), full[:m]), m
    other = gpu_gemm.Variant(variant.block_n, variant.block_k, variant.stages, not variant.asm)
    assert torch.equal(gpu_gemm.packed_matmul(qx, qw, torch.float32, variant=other), full)


@pytest.mark.gpu
def test_the_packed_gemm_replays_in_a_cuda_graph():
    """No host synchronisation in the launch: a captured product replays to the eager one's bits."""
    qx, qw, _ = _operands(8, 512, 2048, 3)
    eager = gpu_gemm.packed_matmul(qx, qw, torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        captured = gpu_gemm.packed_matmul(qx, qw, torch.bfloat16)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


@pytest.mark.parametrize("m,k", [(5, 272), (3, 528)])  # K padded to the step; K split 8 ways, some empty
def test_planar_activations_give_the_same_bits(m, k):
    """The activations copied planar in the contraction order (the large-M layout) against the same
    activations read in place: the same values meet the same weights in the same order."""
    qx, qw, ref = _operands(m + 4, 40, k, 11)
    qx = _rows(qx, m)
    base = gpu_gemm.variant_for(40, k, torch.device(DEVICE))
    planar = gpu_gemm.Variant(base.block_n, base.block_k, base.stages, base.asm, base.warps, planar_from=1)
    y = gpu_gemm.packed_matmul(qx, qw, torch.float32, variant=planar)
    assert torch.equal(y, gpu_gemm.packed_matmul(qx, qw, torch.float32, variant=base))
    assert float((y.double().cpu() - ref[:m]).norm() / ref[:m].norm()) < 1e-4
