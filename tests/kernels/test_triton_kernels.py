"""The Triton NVFP4 kernels against the torch reference (docs/design.md §2's bit-exact contract).

On a CUDA machine they run compiled on the GPU; elsewhere under Triton's interpreter (set up in
``tests/conftest.py``), which executes the same kernel code on the CPU with correctly rounded float32
operations — so CI checks the kernels' arithmetic and the GPU run checks the compiler (FMA contraction,
approximate division) on top.
"""

import dataclasses

import pytest
import torch

from nibble.kernels import backend, gemm, nvfp4
from nibble.kernels.tensors import NVFP4Tensor
from tests.helpers import assert_same_bits, gaussian, heavy_tailed, parity_inputs

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu import gemm as gpu_gemm  # imports triton, hence after the skip
from nibble.kernels.gpu import nvfp4 as gpu_nvfp4
from nibble.kernels.gpu import row_invariance

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# the interpreter is slow: trim every input case to a few rows off the GPU
MAX_ROWS = None if CUDA else 8
DTYPES = [torch.float32, torch.bfloat16, torch.float16] if CUDA else [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", ["per_tensor", "per_token"])
@pytest.mark.parametrize("four_over_six", [None, "mse", "mae"])
def test_quantize_is_bit_identical_to_the_reference(dtype, scale, four_over_six):
    for name, x in parity_inputs(dtype, MAX_ROWS).items():
        ref, ref_map = nvfp4.quantize_with_choices(x, scale=scale, four_over_six=four_over_six, backend="reference")
        out, out_map = nvfp4.quantize_with_choices(
            x.to(DEVICE), scale=scale, four_over_six=four_over_six, backend="triton"
        )
        assert out.global_scale.shape == ref.global_scale.shape, name
        assert_same_bits(ref.codes, out.codes, f"{name} codes")
        assert_same_bits(ref.block_scales, out.block_scales, f"{name} block scales")
        assert_same_bits(ref.global_scale, out.global_scale, f"{name} global scale")
        assert_same_bits(ref_map, out_map, f"{name} map-to-4 choices")
        assert_same_bits(ref.dequantize(), nvfp4.dequantize(out, backend="triton"), f"{name} dequantised")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("four_over_six", [None, "mse"])
def test_rows_shared_by_several_programs_give_the_same_bits(dtype, split, four_over_six):
    """A decode step's few rows are split over programs that each reduce the row's amax (the default on a GPU
    the rows alone do not fill); forced here on every input, long rows (several chunks) included."""
    for name, x in {**parity_inputs(dtype, MAX_ROWS), "long_rows": heavy_tailed((3, 9600), 9).to(dtype)}.items():
        ref, ref_map = nvfp4.quantize_with_choices(
            x, scale="per_token", four_over_six=four_over_six, backend="reference"
        )
        out, out_map = gpu_nvfp4.quantize(
            x.to(DEVICE), per_token=True, four_over_six=four_over_six, with_choices=True, split=split
        )
        assert_same_bits(ref.codes, out.codes, f"{name} codes")
        assert_same_bits(ref.block_scales, out.block_scales, f"{name} block scales")
        assert_same_bits(ref.global_scale, out.global_scale, f"{name} global scale")
        assert_same_bits(ref_map, out_map, f"{name} map-to-4 choices")


def test_split_must_be_positive():
    with pytest.raises(ValueError, match="split"):
        gpu_nvfp4.quantize(torch.ones(2, 32, device=DEVICE), per_token=True, four_over_six=None, split=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("four_over_six", [None, "mse", "mae"])
def test_gemm_operand_is_the_decoded_codes(dtype, four_over_six):
    """The operand the quantise kernel writes for the GEMMs is the codes decoded without the global scale,
    bit for bit (signed zeros included), in the dtype the GEMM kernels read."""
    operand_dtype = torch.float16 if CUDA else torch.float32
    for name, x in parity_inputs(dtype, MAX_ROWS).items():
        for scale in ("per_token", "per_tensor"):
            q = nvfp4.quantize(
                x.to(DEVICE), scale=scale, four_over_six=four_over_six, backend="triton", gemm_operand=True
            )
            decoded = q.unscaled().dequantize(torch.float32).to(operand_dtype)
            assert_same_bits(decoded, q.operand, f"{name} {scale} operand")
    assert nvfp4.quantize(x, scale="per_token", backend="reference", gemm_operand=True).operand is None


@pytest.mark.long
def test_products_with_the_quantiser_s_operand_give_the_same_bits():
    x, w = heavy_tailed((5, 2080), 3).to(DEVICE), heavy_tailed((48, 2080), 5).to(DEVICE)
    qw = nvfp4.quantize(w, scale="per_tensor", four_over_six="mse", backend="triton")
    plain = nvfp4.quantize(x, scale="per_token", four_over_six="mse", backend="triton")
    with_operand = nvfp4.quantize(x, scale="per_token", four_over_six="mse", backend="triton", gemm_operand=True)
    dense = gemm.matmul(plain, qw, backend="triton")
    assert_same_bits(dense, gemm.matmul(with_operand, qw, backend="triton"), "dense")
    stack = nvfp4.quantize(heavy_tailed((3, 48 * 2080), 6).to(DEVICE), scale="per_token", backend="triton")
    qws = NVFP4Tensor(
        stack.codes.reshape(3, 48, 1040), stack.block_scales.reshape(3, 48, 130), stack.global_scale, False,
        torch.Size((3, 48, 2080)),
    )  # fmt: skip
    experts = torch.tensor([0, 0, 1, 2, 2, 2, 2], device=DEVICE)
    rows = torch.tensor([0, 4, 1, 0, 2, 3, 4], device=DEVICE)
    grouped = gemm.grouped_matmul(plain, qws, experts, rows, backend="triton")
    assert_same_bits(grouped, gemm.grouped_matmul(with_operand, qws, experts, rows, backend="triton"), "grouped")
    stale = dataclasses.replace(with_operand, operand=with_operand.operand[:, :16])
    with pytest.raises(ValueError, match="activation operand"):
        gemm.matmul(stale, qw, backend="triton")


@pytest.mark.parametrize(
    "shape",
    [(1, 16), (3, 48), (2, 5, 80), (1, 8208), (2, 9600)],
    ids=["one-block", "odd-rows", "3d", "longer-than-a-tile", "split-rows"],
)
@pytest.mark.parametrize("scale", ["per_tensor", "per_token"])
def test_shapes_that_are_not_tile_multiples(shape, scale):
    x = heavy_tailed(shape, 7)
    x.reshape(-1, shape[-1])[0, :16] = 0.0  # an all-zero block
    for fos in (None, "mse"):
        ref = nvfp4.quantize(x, scale=scale, four_over_six=fos, backend="reference")
        out = nvfp4.quantize(x.to(DEVICE), scale=scale, four_over_six=fos, backend="triton")
        assert out.codes.shape == ref.codes.shape and out.block_scales.shape == ref.block_scales.shape
        assert_same_bits(ref.codes, out.codes, f"{shape} codes")
        assert_same_bits(ref.block_scales, out.block_scales, f"{shape} scales")
        assert_same_bits(ref.global_scale, out.global_scale, f"{shape} global scale")


def test_all_zero_and_empty_inputs():
    for x in (torch.zeros(4, 32), torch.zeros(0, 32), -torch.zeros(2, 16)):
        for scale in ("per_tensor", "per_token"):
            ref = nvfp4.quantize(x, scale=scale, four_over_six="mse", backend="reference")
            out = nvfp4.quantize(x.to(DEVICE), scale=scale, four_over_six="mse", backend="triton")
            assert_same_bits(ref.codes, out.codes, "codes")
            assert_same_bits(ref.global_scale, out.global_scale, "global scale")
            assert out.global_scale.shape == ref.global_scale.shape


def test_dequantize_of_an_expert_stack_with_per_expert_scales():
    w = gaussian((3, 8, 64), 2)
    flat = nvfp4.quantize(w.reshape(3, -1), scale="per_token", backend="reference")
    stack = NVFP4Tensor(
        flat.codes.reshape(3, 8, 32), flat.block_scales.reshape(3, 8, 4), flat.global_scale, False, w.shape
    )
    moved = NVFP4Tensor(*(t.to(DEVICE) for t in (stack.codes, stack.block_scales, stack.global_scale)), False, w.shape)
    for dtype in (torch.float32, torch.bfloat16):
        assert_same_bits(stack.dequantize(dtype).float(), nvfp4.dequantize(moved, dtype, backend="triton").float(), "x")


def _rel_frobenius(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref).norm() / ref.norm())


# The bound is 1e-4; the interpreter's float32 products and sums reach ~1e-7, so on the CPU a much
# smaller error would already betray a wrong decode.
GEMM_TOLERANCE = 1e-6 if DEVICE == "cpu" else 1e-4


@pytest.mark.parametrize("m", [1, 5, 17, 64, 130])
@pytest.mark.parametrize("n,k", [(48, 96), (200, 272), (40, 528)])  # the last spans two chunks of 32 blocks
def test_gemm_matches_float64_products_of_the_same_codes(m, n, k):
    x = heavy_tailed((m, k), m)
    w = gaussian((n, k), 3).to(torch.bfloat16)
    qx = nvfp4.quantize(x.to(DEVICE), scale="per_token", four_over_six="mse", backend="triton")
    qw = nvfp4.quantize(w.to(DEVICE), scale="per_tensor", four_over_six="mse", backend="triton")
    ref_qx = nvfp4.quantize(x, scale="per_token", four_over_six="mse", backend="reference")
    assert_same_bits(ref_qx.codes, qx.codes, "activation codes")  # the GEMM's operand is the reference's
    y = gemm.matmul(qx, qw, backend="triton")
    ref = qx.dequantize(torch.float64).cpu() @ qw.dequantize(torch.float64).cpu().T
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert _rel_frobenius(y, ref) < GEMM_TOLERANCE
    assert _rel_frobenius(gpu_gemm.packed_matmul(qx, qw, torch.float32), ref) < GEMM_TOLERANCE
    cpu_qw = NVFP4Tensor(qw.codes.cpu(), qw.block_scales.cpu(), qw.global_scale.cpu(), True, qw.shape)
    assert _rel_frobenius(gemm.matmul(ref_qx, cpu_qw, out_dtype=torch.float64, backend="reference"), ref) < 1e-12


@pytest.mark.parametrize("tile", row_invariance.ROW_TILES_USED)
def test_every_row_tile_gives_the_same_bits(tile):
    """Each (BLOCK_M, num_warps) of the row-tile table, forced, on shapes that leave partial row tiles: the
    block-ordered sum (docs/design.md §2.6) does not depend on the tile."""
    m, n, k = 70, 200, 272
    qx = nvfp4.quantize(heavy_tailed((m, k), 5).to(DEVICE), scale="per_token", four_over_six="mse")
    qw = nvfp4.quantize(gaussian((n, k), 6).to(DEVICE).to(torch.bfloat16), scale="per_tensor", four_over_six="mse")
    reference = gpu_gemm.packed_matmul(qx, qw, torch.float32, row_invariance.REFERENCE_TILE)
    assert_same_bits(reference.cpu(), gpu_gemm.packed_matmul(qx, qw, torch.float32, tile), "tile")


@pytest.mark.gpu
def test_each_row_gets_the_same_bits_whatever_the_row_count():
    """The row-tile table switches tiles with M: rows of small products equal the same rows of a large one."""
    x, w = heavy_tailed((1500, 512), 1).cuda(), gaussian((384, 512), 2).cuda().to(torch.bfloat16)
    qx = nvfp4.quantize(x, scale="per_token", four_over_six="mse")
    qw = nvfp4.quantize(w, scale="per_tensor", four_over_six="mse")
    full = gpu_gemm.packed_matmul(qx, qw, torch.bfloat16)
    for m in (1, 16, 17, 64, 65, 1024):
        part = NVFP4Tensor(qx.codes[:m], qx.block_scales[:m], qx.global_scale[:m], True, (m, 512))
        assert torch.equal(gpu_gemm.packed_matmul(part, qw, torch.bfloat16), full[:m]), m
    ref = qx.dequantize(torch.float64).cpu() @ qw.dequantize(torch.float64).cpu().T
    assert _rel_frobenius(gemm.matmul(qx, qw), ref) < 1e-4


def _expert_stack(e: int, n: int, k: int, seed: int) -> NVFP4Tensor:
    w = gaussian((e, n, k), seed).to(torch.bfloat16)
    flat = nvfp4.quantize(w.reshape(e, -1).to(DEVICE), scale="per_token", four_over_six="mse")
    return NVFP4Tensor(
        flat.codes.reshape(e, n, k // 2), flat.block_scales.reshape(e, n, k // 16), flat.global_scale, True, w.shape
    )


@pytest.mark.parametrize("tokens,top_k", [(1, 2), (7, 2), (40, 3)])
def test_grouped_gemm_matches_per_expert_products(tokens, top_k):
    e, n, k = 6, 40, 64
    qw = _expert_stack(e, n, k, 4)
    x = heavy_tailed((tokens, k), 5).to(DEVICE)
    qx = nvfp4.quantize(x, scale="per_token", four_over_six="mse")
    gen = torch.Generator().manual_seed(tokens)
    # experts 0 and 5 never chosen: empty groups must be skipped
    chosen = torch.stack([torch.randperm(4, generator=gen)[:top_k] + 1 for _ in range(tokens)]).reshape(-1)
    order = torch.argsort(chosen, stable=True)
    experts, rows = chosen[order].to(DEVICE), (order // top_k).to(DEVICE)
    y = gemm.grouped_matmul(qx, qw, experts, rows, backend="triton")
    ref = gemm.grouped_matmul(qx, qw, experts, rows, out_dtype=torch.float64, backend="reference")
    assert y.shape == (tokens * top_k, n)
    assert _rel_frobenius(y, ref.cpu()) < GEMM_TOLERANCE
    # without x_rows each output row reads its own activation row
    y2 = gemm.grouped_matmul(qx, qw, experts[:tokens].sort().values, backend="triton")
    ref2 = gemm.grouped_matmul(qx, qw, experts[:tokens].sort().values, out_dtype=torch.float64, backend="reference")
    assert _rel_frobenius(y2, ref2.cpu()) < GEMM_TOLERANCE


@pytest.mark.parametrize("m", [1, 17])
def test_gemm_of_heavy_tailed_weights_keeps_the_tiny_products(m):
    """Heavy-tailed weights put ~2% of decoded weights below float16's normal range (subnormal products
    of a small nibble and a small block scale): flushing them to zero would show here."""
    n, k = 40, 528
    qx = nvfp4.quantize(heavy_tailed((m, k), 7).to(DEVICE), scale="per_token", four_over_six="mse")
    qw = nvfp4.quantize(heavy_tailed((n, k), 8).to(DEVICE), scale="per_tensor", four_over_six="mse")
    ref = qx.dequantize(torch.float64).cpu() @ qw.dequantize(torch.float64).cpu().T
    assert _rel_frobenius(gpu_gemm.packed_matmul(qx, qw, torch.float32), ref) < GEMM_TOLERANCE


def test_grouped_gemm_of_few_rows_and_experts():
    e, n, k, tokens = 2, 16, 512, 3  # 2 experts x 1 column tile
    qw = _expert_stack(e, n, k, 9)
    qx = nvfp4.quantize(heavy_tailed((tokens, k), 10).to(DEVICE), scale="per_token", four_over_six="mse")
    experts = torch.tensor([0, 1, 1], device=DEVICE)
    y = gemm.grouped_matmul(qx, qw, experts, backend="triton")
    ref = gemm.grouped_matmul(qx, qw, experts, out_dtype=torch.float64, backend="reference")
    assert _rel_frobenius(y, ref.cpu()) < GEMM_TOLERANCE


def test_gemm_rejects_bad_operands():
    qx = nvfp4.quantize(gaussian((4, 32), 1), scale="per_token")
    qw = nvfp4.quantize(gaussian((8, 48), 2), scale="per_tensor")
    with pytest.raises(ValueError, match="K=32"):
        gemm.matmul(qx, qw)
    with pytest.raises(ValueError, match="NVFP4Tensor"):
        gemm.matmul(gaussian((4, 32), 1), qw)
    stack = _expert_stack(3, 8, 32, 1)
    qx = nvfp4.quantize(gaussian((4, 32), 1).to(DEVICE), scale="per_token")
    with pytest.raises(ValueError, match="sorted ascending"):
        gemm.grouped_matmul(qx, stack, torch.tensor([2, 0, 1, 1], device=DEVICE))
    with pytest.raises(ValueError, match="sorted ascending"):
        gemm.grouped_matmul(qx, stack, torch.tensor([0, 1, 2, 3], device=DEVICE))
    with pytest.raises(ValueError, match="pass x_rows"):
        gemm.grouped_matmul(qx, stack, torch.tensor([0, 1], device=DEVICE))
    experts = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="x_rows must be int64"):  # the CUDA kernels read int64 rows
        gemm.grouped_matmul(qx, stack, experts, torch.tensor([0, 3], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="x_rows must be int64"):
        gemm.grouped_matmul(qx, stack, experts, torch.tensor([0], device=DEVICE))
    with pytest.raises(ValueError, match="index the 4 activation rows"):
        gemm.grouped_matmul(qx, stack, experts, torch.tensor([0, 4], device=DEVICE))


def test_backend_choice():
    assert backend.resolve(torch.device("cpu"), None) == "reference"
    with pytest.raises(ValueError, match="backend='cuda' is not one of"):
        backend.resolve(torch.device("cpu"), "cuda")
    with pytest.raises(ValueError, match="stochastic"):
        nvfp4.quantize(gaussian((2, 32), 1), rounding="stochastic", generator=torch.Generator(), backend="triton")


def test_triton_on_a_cpu_tensor_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        nvfp4.quantize(gaussian((2, 32), 1), backend="triton")
