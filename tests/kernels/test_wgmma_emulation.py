"""The warpgroup-MMA gemm (``nvfp4_fragment_wgmma``) emulated on the CPU, byte for byte: its staging into shared
memory, its descriptor, the register layouts wgmma reads and writes (PTX ISA: A per warp as mma.m16n8k16's A, D
as CUTLASS's CLayout_64xN, B in each K-major layout the kernel can take) and its block-ordered adds, checked
against the CPU reference's bits. It mirrors the kernel's index math on purpose, so that an edit to one that the
other does not follow fails here before it reaches a GPU; whether the hardware reads the layouts as the PTX ISA
says is benchmarks/wgmma_probe_gpu.py's question, and the GPU bit test's."""

import sys

import numpy as np
import pytest
import torch

from nibble.kernels import nvfp4
from nibble.kernels.fragments import REGISTER_BITS, element_order, to_fragments
from nibble.kernels.reference import block_gemm
from tests.helpers import heavy_tailed

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm

ROWS, WARPS, STEP = fragment_gemm.WGMMA_ROWS, 8, 128
X_BYTES = fragment_gemm.wgmma_shared_bytes(1) - WARPS * 1152


def test_the_fragment_k_order_is_the_fragment_layouts():
    # lane c, register r, half e holds element 4c + 2(r // 2) + e, which mma numbers 2c + 8(r // 2) + e
    _, element = element_order()
    for lane in range(32):
        for register in range(4):
            for half in range(2):
                logical = 2 * (lane % 4) + 8 * (register // 2) + half
                assert fragment_gemm.FRAGMENT_K_ORDER[logical] == element[lane, register, half]


def _halves(words: np.ndarray) -> np.ndarray:
    """uint32 words as float64 pairs (low half first)."""
    return words.astype(np.uint32).view(np.float16).reshape(*words.shape, 2).astype(np.float64)


def _weight_operands(words: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """A warp's decoded, scaled operand of each of a quad's four blocks, float64 ``[4 blocks, 16 rows, 16 slots]``
    (slots in mma's logical K order), from its 32 lanes' words ``[32, 4]`` and scale pairs ``[8, 2]``: what
    fragment_gemm.cu's decode and scale_operands compute, read through the fragment layout's definition."""
    row, element = element_order()
    codes = torch.zeros(4, 16, 16, dtype=torch.int64)
    bits = torch.from_numpy(words.astype(np.int64))
    for j in range(4):  # a lane's word j holds block j's 8 codes: registers 0..3, halves 0..1, per REGISTER_BITS
        for lane in range(32):
            for register in range(4):
                for half in range(2):
                    code = _code(int(bits[lane, j]), register, half)
                    codes[j, row[lane, register, half], element[lane, register, half]] = code
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    magnitude = values[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    scale_bytes = torch.from_numpy(scales.astype(np.uint32).view(np.uint8).reshape(8, 8).copy())
    block_scales = torch.empty(4, 16, dtype=torch.float64)
    for j in range(4):  # pair p of the quad: rows p and p + 8, byte 2j and 2j + 1
        for p in range(8):
            block_scales[j, p] = scale_bytes[p, 2 * j].view(torch.float8_e4m3fn).to(torch.float64)
            block_scales[j, p + 8] = scale_bytes[p, 2 * j + 1].view(torch.float8_e4m3fn).to(torch.float64)
    operand = magnitude * 2.0**-14 * block_scales[:, :, None]
    return operand[:, :, list(fragment_gemm.FRAGMENT_K_ORDER)].numpy()


def _code(word: int, register: int, half: int) -> int:
    magnitude_bits = REGISTER_BITS[register][0 if half == 0 else 2]
    sign_bit = REGISTER_BITS[register][1 if half == 0 else 3]
    magnitude = sum(((word >> bit) & 1) << i for i, bit in enumerate(magnitude_bits))
    return magnitude | (((word >> sign_bit) & 1) << 3)


def _copy_lane(swizzle: int, warp: int, lane: int) -> tuple[int, int]:
    """The activation row and half a lane copies (fragment_gemm.cu's xrow, xhalf)."""
    if swizzle == 0:
        return 16 * warp + (lane & 7) + 8 * (lane >> 4), (lane >> 3) & 1
    if swizzle == 32:
        return 16 * warp + 4 * (lane >> 3) + ((lane >> 1) & 3), lane & 1
    return 16 * warp + 8 * (lane >> 4) + 2 * ((lane >> 1) & 3) + ((lane >> 3) & 1), lane & 1


def _copy_offset(swizzle: int, block: int, row: int, half: int) -> int:
    """Where the kernel writes a row's half of a block in the stage (fragment_gemm.cu's wg_x_offset), bytes."""
    if swizzle == 0:
        return ((block * 2 + half) * ROWS + row) * 16
    if swizzle == 32:
        return block * 2 * ROWS * 16 + row * 32 + ((half ^ ((row >> 2) & 1)) << 4)
    return (block // 4) * 8 * ROWS * 16 + row * 128 + ((((block % 4) * 2 + half) ^ (row & 7)) << 4)


def _b_addresses(swizzle: int, block: int) -> np.ndarray:
    """Where wgmma reads B's element ``[n, k]`` (int64 ``[128, 16]``, bytes into the stage) for the kernel's
    descriptor of ``block``: the PTX ISA's K-major canonical layouts, as CUTLASS's make_gmma_desc writes them in
    16-byte units: no swizzle ``((8, n), 2) : ((1, SBO), LBO)``; 32- and 128-byte swizzles ``Swizzle<1|3, 4, 3> o
    ((8, n), 2) : ((2|8, SBO), 1)``, the swizzle XOR-ing address bits 4.. with bits 7.. of the shared address."""
    nn, kk = np.arange(ROWS)[:, None], np.arange(16)[None, :]
    if swizzle == 0:  # the leading byte offset along K (2048 bytes), the stride one along N (128)
        start, leading, stride = block * 2 * 16 * ROWS, 2 * 8 * ROWS, 128
        return start + (nn // 8) * stride + (nn % 8) * 16 + (kk // 8) * leading + (kk % 8) * 2
    row_bytes = swizzle
    start = block * 2 * 16 * ROWS if swizzle == 32 else (block // 4) * 8 * ROWS * 16 + (block % 4) * 32
    plain = start + (nn // 8) * 8 * row_bytes + (nn % 8) * row_bytes + (kk // 8) * 16 + (kk % 8) * 2
    return plain ^ (((plain >> 7) & (swizzle // 16 - 1)) << 4)


def _emulate(qx, qw, k_order=fragment_gemm.FRAGMENT_K_ORDER, swizzle: int = 0) -> torch.Tensor:
    m, k = qx.shape
    n = qw.shape[0]
    x, xg = gpu_gemm._activations(qx)
    x = x.to(torch.float16).view(m, k // 16, 16)[:, :, list(k_order)].reshape(m, k).numpy()
    xg = xg.numpy()
    wg = np.float32(qw.global_scale.to(torch.float32).item())
    frag = to_fragments(qw.codes, qw.block_scales)
    words = frag.words[0].numpy().view(np.uint32)  # [G, Q, 32, 4]
    scales = frag.scales[0].numpy().view(np.uint32).reshape(*frag.scales.shape[1:3], 8, 2)  # [G, Q, 8 pairs, 2]
    groups, quads = words.shape[:2]
    out = np.full((m, n), np.nan, dtype=np.float32)
    steps = (quads + 1) // 2
    decoded = {}  # (group, quad): its four blocks' operands
    for bx in range(-(-m // ROWS)):
        for by in range(-(-groups // WARPS)):
            acc = np.zeros((WARPS, 16, ROWS), np.float32)
            total = np.zeros_like(acc)
            for step in range(steps):
                stage = np.zeros(X_BYTES, np.uint8)
                for warp in range(WARPS):  # the kernel's activation copies, lane by lane
                    for lane in range(32):
                        row, half = _copy_lane(swizzle, warp, lane)
                        for block in range(8):
                            element = step * STEP + block * 16 + half * 8
                            if bx * ROWS + row < m and element < k:
                                dst = _copy_offset(swizzle, block, row, half)
                                stage[dst : dst + 16] = x[bx * ROWS + row, element : element + 8].view(np.uint8)
                for block in range(8):  # B through the descriptor
                    at = _b_addresses(swizzle, block)
                    b = stage.view(np.uint8)[at[..., None] + np.arange(2)].copy().view(np.float16)[..., 0]
                    quad, j = 2 * step + block // 4, block % 4
                    for warp in range(WARPS):
                        g = by * WARPS + warp
                        if g < groups and quad < quads:
                            if (g, quad) not in decoded:
                                decoded[g, quad] = _weight_operands(words[g, quad], scales[g, quad])
                            a = decoded[g, quad][j]
                        else:
                            a = np.zeros((16, 16))
                        d = a @ b.astype(np.float64).T  # exact: each block's sum spans at most 20 bits
                        assert np.array_equal(d.astype(np.float32), d)
                        acc[warp] = acc[warp] + d.astype(np.float32)
                if (2 * step + 2) % fragment_gemm.CHUNK_QUADS == 0 or step == steps - 1:
                    total, acc = total + acc, np.zeros_like(acc)
            for warp in range(WARPS):
                g = by * WARPS + warp
                for r in range(16):
                    for t in range(ROWS):
                        row, col = bx * ROWS + t, g * 16 + r
                        if row < m and col < n:
                            v = np.float32(total[warp, r, t] * np.float32(16384.0))
                            out[row, col] = np.float32(np.float32(v * xg[row]) * wg)
    return torch.from_numpy(out)


def _operands(m: int, n: int, k: int, seed: int):
    qx = nvfp4.quantize(heavy_tailed((m, k), seed), scale="per_token", four_over_six="mse")
    qw = nvfp4.quantize(heavy_tailed((n, k), seed + 1).to(torch.bfloat16), scale="per_tensor", four_over_six="mse")
    return qx, qw


@pytest.mark.parametrize("swizzle", fragment_gemm.WGMMA_SWIZZLES)
@pytest.mark.parametrize("m,n,k", [(3, 40, 96), (130, 24, 2112), (2, 136, 1040)])
def test_the_emulated_kernel_gives_the_reference_bits(m, n, k, swizzle):
    """Rows past the 128-row tile, column groups past the weight's and a second column CTA, K ending inside a
    quad and a step, five chunks; under every shared-memory layout."""
    qx, qw = _operands(m, n, k, seed=m + n)
    expected = block_gemm.matmul(qx, qw, torch.float32)
    assert torch.equal(_emulate(qx, qw, swizzle=swizzle).view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("swizzle", fragment_gemm.WGMMA_SWIZZLES)
def test_each_quarter_warp_copy_reads_whole_sectors_or_writes_without_bank_conflicts(swizzle):
    """Per copy instruction (one block, a warp's 32 lanes), each group of 8 lanes — the unit in which shared memory
    takes 16-byte stores — covers 8 different 16-byte bank groups; with a swizzle, also whole 32-byte sectors of
    the activations (each row's two halves in the same 8 lanes: ncu counted the unswizzled copy's sectors twice)."""
    for warp, block in ((0, 0), (3, 5), (7, 7)):
        for quarter in range(4):
            lanes = [_copy_lane(swizzle, warp, 8 * quarter + i) for i in range(8)]
            banks = {(_copy_offset(swizzle, block, row, half) % 128) // 16 for row, half in lanes}
            assert len(banks) == 8, (warp, block, quarter)
            if swizzle:
                assert {row for row, _ in lanes} == {row for row, half in lanes if half == 0}
                assert sorted(half for _, half in lanes) == [0] * 4 + [1] * 4


def test_the_emulation_fails_when_a_swizzled_copy_ignores_the_swizzle(monkeypatch):
    qx, qw = _operands(3, 40, 96, seed=7)
    unswizzled = _copy_offset
    monkeypatch.setattr(sys.modules[__name__], "_copy_offset", lambda _, *where: unswizzled(0, *where))
    assert not torch.equal(_emulate(qx, qw, swizzle=128), block_gemm.matmul(qx, qw, torch.float32))
