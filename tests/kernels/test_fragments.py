"""The fragment layout of packed NVFP4 weights (nibble.kernels.fragments), emulated at register level.

Off the GPU the CUDA kernels cannot run, so their decode (the integer operations of
``kernels/gpu/fragment_gemm.cu``'s ``decode``) and the lane-to-element mapping of both mma operands are
emulated here over the layout, and the emulated product must equal the block-ordered reference bit for
bit. On the H200 the kernels themselves are compared with the same reference (``test_block_gemm.py``).
"""

import pytest
import torch

from nibble.kernels import gemm, nvfp4
from nibble.kernels.fragments import NVFP4Fragments, mismatch, reference_words, to_fragments
from nibble.kernels.reference import block_gemm
from nibble.kernels.tensors import NVFP4Tensor
from tests.helpers import assert_same_bits, gaussian, heavy_tailed

KEEP = 0x8E008E00


def _registers(words: torch.Tensor) -> torch.Tensor:
    """The kernel's ``decode``: int32 words ``[...]`` -> the four operand registers' float16 pairs as
    float64 ``[..., 4, 2]`` (values ``e2m1 · 2^-14``), with 32-bit wrap-around like the GPU's."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    regs = [
        w & KEEP,
        ((w << 3) & 0xFFFFFFFF) & KEEP,
        (((w & 0x20072007) * 516) & 0xFFFFFFFF) & KEEP,
        (((w & 0x40384038) * 66) & 0xFFFFFFFF) & KEEP,
    ]
    stacked = torch.stack(regs, dim=-1)
    halves = torch.stack((stacked & 0xFFFF, stacked >> 16), dim=-1).to(torch.int16)
    return halves.view(torch.float16).to(torch.float64)


def _emulated_weight(frag: NVFP4Fragments) -> torch.Tensor:
    """float64 ``[E, N16, K64]``: the A operand the kernels feed the tensor cores, with its block scales
    applied (``e2m1 · scale · 2^-14``), put back at the (row, element) each lane and k-slot stands for."""
    e, g, q = frag.words.shape[:3]
    regs = _registers(frag.words)  # [E, G, Q, lane, j, register, half]
    scales = frag.scales.view(torch.float8_e4m3fn).to(torch.float64).reshape(e, g, q, 8, 4, 2)  # grp, j, row half
    out = torch.zeros(e, g, 16, q, 4, 16, dtype=torch.float64)
    for lane in range(32):
        grp, c = divmod(lane, 4)
        for register in range(4):
            row_half = register % 2
            for half in range(2):
                element = 4 * c + 2 * (register // 2) + half
                value = regs[:, :, :, lane, :, register, half] * scales[:, :, :, grp, :, row_half]
                out[:, :, grp + 8 * row_half, :, :, element] = value
    return out.reshape(e, g * 16, q * 64)


def _quantized_weight(n: int, k: int, seed: int) -> NVFP4Tensor:
    w = heavy_tailed((n, k), seed).to(torch.bfloat16)
    return nvfp4.quantize(w, scale="per_tensor", four_over_six="mse", backend="reference")


@pytest.mark.parametrize("n,k", [(16, 64), (40, 96), (33, 528), (64, 1040)])
def test_every_code_and_scale_lands_where_the_kernels_read_it(n, k):
    """N and K off the tile (padding rows and blocks decode to zero)."""
    qw = _quantized_weight(n, k, seed=n + k)
    frag = to_fragments(qw.codes, qw.block_scales)
    assert frag.words.dtype == torch.int32 and frag.scales.dtype == torch.uint8
    decoded = _emulated_weight(frag)[0]
    ones = NVFP4Tensor(qw.codes, qw.block_scales, torch.ones(()), True, qw.shape)
    assert_same_bits(ones.dequantize(torch.float64) * 2.0**-14, decoded[:n, :k], "weights")
    assert not decoded[n:].any() and not decoded[:, k:].any()


def test_every_code_and_signed_zero_survives_the_decode():
    codes = (torch.arange(16 * 32) % 256).to(torch.uint8).reshape(16, 32)  # every byte value, twice
    scales = torch.full((16, 4), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn)  # 1.0
    decoded = _emulated_weight(to_fragments(codes, scales))[0]
    expected = NVFP4Tensor(codes, scales, torch.ones(()), False, torch.Size((16, 64))).dequantize(torch.float64)
    assert_same_bits(expected * 2.0**-14, decoded, "codes")  # -0 stays -0: the sign bit is carried


@pytest.mark.parametrize("m,n,k", [(1, 48, 96), (5, 33, 528), (8, 40, 1040), (32, 64, 2112)])
def test_the_emulated_kernels_equal_the_block_ordered_reference(m, n, k):
    """B operand: lane (grp, c) reads activation elements 4c … 4c + 3 of its row's block, the k-slots its
    A registers hold; one exact product per block, added in the kernels' order."""
    qx = nvfp4.quantize(heavy_tailed((m, k), m), scale="per_token", four_over_six="mse", backend="reference")
    qw = _quantized_weight(n, k, seed=k)
    w = _emulated_weight(to_fragments(qw.codes, qw.block_scales))[0][:n, :k].reshape(n, k // 16, 16)
    ones = NVFP4Tensor(qx.codes, qx.block_scales, torch.ones_like(qx.global_scale), True, qx.shape)
    x = ones.dequantize(torch.float64).reshape(m, k // 16, 16)
    partial = block_gemm.ordered_sum(torch.einsum("mbi,nbi->bmn", x, w).to(torch.float32))
    emulated = ((partial * 16384.0) * qx.global_scale.reshape(-1, 1)) * qw.global_scale
    assert_same_bits(block_gemm.matmul(qx, qw), emulated, "product")


def test_an_expert_stack_keeps_its_experts_apart():
    w = gaussian((3, 24, 96), 3).to(torch.bfloat16)
    flat = nvfp4.quantize(w.reshape(3, -1), scale="per_token", four_over_six="mse", backend="reference")
    codes, scales = flat.codes.reshape(3, 24, 48), flat.block_scales.reshape(3, 24, 6)
    frag = to_fragments(codes, scales)
    assert tuple(frag.words.shape) == (3, 2, 2, 32, 4) and tuple(frag.scales.shape) == (3, 2, 2, 8, 8)
    for expert in range(3):
        single = to_fragments(codes[expert], scales[expert])
        assert torch.equal(frag.words[expert], single.words[0]) and torch.equal(frag.scales[expert], single.scales[0])


def test_with_fragments_and_refresh():
    qw = _quantized_weight(40, 96, seed=5)
    prepared = gemm.with_fragments(qw)
    assert prepared.codes is qw.codes and prepared.fragments is not None
    other = _quantized_weight(40, 96, seed=6)
    words = prepared.fragments.words
    prepared.codes.copy_(other.codes)
    prepared.block_scales.copy_(other.block_scales)
    gemm.refresh_fragments(prepared)
    assert prepared.fragments.words is words  # the same storage: a captured graph keeps reading it
    fresh = to_fragments(other.codes, other.block_scales)
    assert torch.equal(words, fresh.words) and torch.equal(prepared.fragments.scales, fresh.scales)
    with pytest.raises(ValueError, match="NVFP4 weight"):
        gemm.with_fragments(nvfp4.quantize(gaussian((2, 4, 32), 1), scale="per_token").codes)


def test_bad_layout_inputs_are_named():
    with pytest.raises(ValueError, match="codes must be uint8"):
        to_fragments(torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="do not match"):
        to_fragments(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8))


@pytest.mark.parametrize("e,n,k", [(1, 16, 64), (1, 40, 96), (3, 33, 528), (2, 64, 1040)])
def test_the_gpu_construction_gives_the_reference_words(e, n, k):
    """The Triton kernel that builds the layout on CUDA (run here by the interpreter) against the PyTorch
    construction, on every byte value."""
    pytest.importorskip("triton", reason="the triton package is not installed")
    from nibble.kernels.gpu.fragment_layout import fragment_words

    codes = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(k))
    assert torch.equal(fragment_words(codes), reference_words(codes))


@pytest.mark.gpu
def test_the_layout_built_on_cuda_is_the_reference_layout():
    qw = nvfp4.quantize(heavy_tailed((3, 40, 1040), 4).to(torch.bfloat16).reshape(120, 1040), scale="per_tensor")
    codes, scales = qw.codes.reshape(3, 40, 520), qw.block_scales.reshape(3, 40, 65)
    on_gpu = to_fragments(codes.cuda(), scales.cuda())
    on_cpu = to_fragments(codes, scales)
    assert torch.equal(on_gpu.words.cpu(), on_cpu.words) and torch.equal(on_gpu.scales.cpu(), on_cpu.scales)


def test_fragments_that_do_not_fit_their_codes_are_refused_by_name():
    """The CUDA kernels take N, K and the strides from the fragments: a layout of another weight (a weight
    sliced, or refreshed from other codes) must be refused, not read."""
    pytest.importorskip("triton", reason="the triton package is not installed")
    from nibble.kernels.gpu import gemm as gpu_gemm

    qw = gemm.with_fragments(_quantized_weight(40, 96, seed=7))
    assert mismatch(qw.fragments, qw.codes, qw.block_scales) is None
    sliced = NVFP4Tensor(qw.codes[:16], qw.block_scales[:16], qw.global_scale, True, torch.Size((16, 96)), qw.fragments)
    with pytest.raises(ValueError, match=r"do not fit codes \(16, 48\)"):
        gpu_gemm._fragments(sliced)
    wrong_type = NVFP4Tensor(qw.codes, qw.block_scales, qw.global_scale, True, qw.shape, "words")
    with pytest.raises(ValueError, match="NVFP4Fragments"):
        gpu_gemm._fragments(wrong_type)
    with pytest.raises(ValueError, match="no longer fit"):
        gemm.refresh_fragments(sliced)


def test_to_fragments_refuses_empty_weights_and_partial_blocks():
    with pytest.raises(ValueError, match="not empty"):
        to_fragments(torch.zeros(0, 8, dtype=torch.uint8), torch.zeros(0, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="K % 16"):
        to_fragments(torch.zeros(4, 6, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8))


def test_selecting_an_expert_keeps_its_fragments_as_a_view():
    from nibble.recipe.linear import select

    w = gaussian((3, 24, 96), 3).to(torch.bfloat16)
    flat = nvfp4.quantize(w.reshape(3, -1), scale="per_token", four_over_six="mse", backend="reference")
    stack = gemm.with_fragments(
        NVFP4Tensor(
            flat.codes.reshape(3, 24, 48), flat.block_scales.reshape(3, 24, 6), flat.global_scale, True, w.shape
        )
    )
    one = select(stack, 1)
    assert one.fragments.words.data_ptr() == stack.fragments.words[1].data_ptr()
    assert mismatch(one.fragments, one.codes, one.block_scales) is None
    fresh = to_fragments(one.codes, one.block_scales)
    assert torch.equal(one.fragments.words, fresh.words) and torch.equal(one.fragments.scales, fresh.scales)
