"""The NVFP4 GEMMs against the block-ordered reference (docs/design.md §2.6), bit for bit.

Off the GPU the Triton kernel runs under the interpreter; on the H200 (``gpu``-marked tests) the CUDA
kernels (``gemv`` for few rows, ``gemm`` for many) and the compiled Triton kernel must all give the
reference's bits on every row — which is what lets the sampler decode with one kernel and the trainer
score with another.
"""

import re

import pytest
import torch

from nibble.kernels import gemm, nvfp4
from nibble.kernels.reference import block_gemm
from nibble.kernels.tensors import NVFP4Tensor
from tests.helpers import assert_same_bits, gaussian, heavy_tailed

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _operands(m: int, n: int, k: int, seed: int) -> tuple[NVFP4Tensor, NVFP4Tensor]:
    x = heavy_tailed((m, k), seed).to(DEVICE)
    w = heavy_tailed((n, k), seed + 1).to(torch.bfloat16).to(DEVICE)
    qx = nvfp4.quantize(x, scale="per_token", four_over_six="mse")
    qw = nvfp4.quantize(w, scale="per_tensor", four_over_six="mse")
    return qx, qw


def _cpu(q: NVFP4Tensor) -> NVFP4Tensor:
    return NVFP4Tensor(q.codes.cpu(), q.block_scales.cpu(), q.global_scale.cpu(), q.four_over_six, q.shape)


def _expert_stack(e: int, n: int, k: int, seed: int) -> NVFP4Tensor:
    w = heavy_tailed((e, n, k), seed).to(torch.bfloat16).to(DEVICE)
    flat = nvfp4.quantize(w.reshape(e, -1), scale="per_token", four_over_six="mse")
    return NVFP4Tensor(
        flat.codes.reshape(e, n, k // 2), flat.block_scales.reshape(e, n, k // 16), flat.global_scale, True, w.shape
    )


def _routing(tokens: int, top_k: int, used: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(tokens)
    chosen = torch.stack([torch.randperm(used, generator=gen)[:top_k] for _ in range(tokens)]).reshape(-1)
    order = torch.argsort(chosen, stable=True)
    return chosen[order].to(DEVICE), (order // top_k).to(DEVICE)


@pytest.mark.parametrize("m,n,k", [(1, 48, 96), (5, 40, 528), (17, 33, 1040), (3, 64, 2064)])
def test_triton_gemm_gives_the_reference_bits(m, n, k):
    """K across one, two and three chunks of 32 blocks (and a partial last one); N off the column tile."""
    qx, qw = _operands(m, n, k, seed=m + n)
    y = gpu_gemm.packed_matmul(qx, qw, torch.float32)
    assert_same_bits(block_gemm.matmul(_cpu(qx), _cpu(qw)), y, "product")
    f64 = qx.dequantize(torch.float64).cpu() @ qw.dequantize(torch.float64).cpu().T
    assert float((y.double().cpu() - f64).norm() / f64.norm()) < 1e-6


def test_triton_grouped_gemm_gives_the_reference_bits():
    e, n, k = 5, 40, 528
    qw = _expert_stack(e, n, k, 4)
    qx = nvfp4.quantize(heavy_tailed((6, k), 5).to(DEVICE), scale="per_token", four_over_six="mse")
    experts, rows = _routing(6, 2, used=4)  # expert 4 unused
    y = gemm.grouped_matmul(qx, qw, experts, rows, backend="triton")
    assert_same_bits(block_gemm.grouped_matmul(_cpu(qx), _cpu(qw), experts.cpu(), rows.cpu()), y, "grouped")


@pytest.mark.gpu  # Triton's interpreter casts float32 to bf16 by truncation; compiled kernels round to nearest
def test_bf16_output_is_the_float32_result_rounded_once():
    qx, qw = _operands(4, 40, 96, seed=2)
    y32 = gpu_gemm.packed_matmul(qx, qw, torch.float32)
    assert_same_bits(y32.to(torch.bfloat16).cpu(), gpu_gemm.packed_matmul(qx, qw, torch.bfloat16), "bf16")


@pytest.mark.gpu
def test_the_cuda_kernels_compile_here():
    fragment_gemm._module(
        fragment_gemm.GEMV_TILES[0], fragment_gemm.GEMM_TILES[0], False, False, True, 0
    )  # NVRTC's log
    assert fragment_gemm.available(0) and gpu_gemm.cuda_kernels(torch.device("cuda"))


SHAPES = [(m, n, k) for m in (1, 3, 8, 9, 16, 33, 64, 100, 257) for n, k in ((48, 96), (200, 528), (136, 2112))]
SHAPES += [(m, 1024, 7168) for m in (1, 9, 33)] + [(m, 40, 1040) for m in (2, 31, 65)]


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_every_kernel_gives_the_reference_bits_on_cuda(out_dtype, m, n, k):
    qx, qw = _operands(m, n, k, seed=k + m)
    prepared = gemm.with_fragments(qw)
    ref = block_gemm.matmul(_cpu(qx), _cpu(qw), out_dtype)
    assert_same_bits(ref, gpu_gemm.fragment_matmul(qx, prepared, out_dtype, gemv=True), "gemv")
    assert_same_bits(ref, gpu_gemm.fragment_matmul(qx, prepared, out_dtype, gemv=False), "gemm")
    assert_same_bits(ref, gpu_gemm.fragment_matmul(qx, qw, out_dtype), "fragments made on the way")
    assert_same_bits(ref, gpu_gemm.packed_matmul(qx, qw, out_dtype), "triton")
    assert_same_bits(ref, gemm.matmul(qx, prepared, out_dtype=out_dtype), "dispatch")


# every gemv tile, direct and staged, three more of several column groups in one warp and three of several column
# warps (one staged), over weights whose column groups do not fill the last CTA (K = 3072 makes the chunk sums of
# a 32-row CTA of four groups exactly the 48 KB a CTA gets without opting in)
MORE_TILES = {(16, 2, 8, 4, 0, 1), (32, 4, 4, 4, 0, 1), (32, 1, 8, 4, 0, 1)}
MORE_TILES |= {(32, 2, 4, 1, 0, 4), (16, 1, 2, 2, 0, 2), (8, 4, 4, 1, 1, 2)}
TEST_TILES = sorted(set(fragment_gemm.GEMV_TILES) | set(fragment_gemm.STAGED_GEMV_TILES) | MORE_TILES)
HOPPER_SHARED = 232448  # bytes a CTA may opt in to on sm_90


def test_gemv_takes_several_column_groups_only_where_the_product_keeps_enough_ctas():
    # CTAs = row tiles x column CTAs, at least MIN_COLUMN_GROUP_CTAS = 128 for a tile of several groups
    assert fragment_gemm.gemv_tile(32, 512, 7168, HOPPER_SHARED) == (32, 2, 8, 2, 0, 2)  # 8192 rows: 128 CTAs
    assert fragment_gemm.gemv_tile(32, 509, 7168, HOPPER_SHARED) == (32, 2, 8, 2, 0, 2)  # the last CTA part empty
    assert fragment_gemm.gemv_tile(32, 508, 7168, HOPPER_SHARED) == (32, 2, 8, 1, 0, 1)  # 127 CTAs of four
    assert fragment_gemm.gemv_tile(32, 256, 4096, HOPPER_SHARED) == (32, 2, 8, 1, 0, 1)  # 4096 rows, one row tile
    assert fragment_gemm.gemv_tile(64, 256, 4096, HOPPER_SHARED) == (32, 2, 8, 2, 0, 2)  # two row tiles: 128 CTAs
    assert fragment_gemm.gemv_tile(33, 256, 4096, HOPPER_SHARED) == (32, 2, 8, 2, 0, 2)  # row tiles round up
    assert fragment_gemm.gemv_tile(33, 252, 4096, HOPPER_SHARED) == (32, 2, 8, 1, 0, 1)  # 2 x 63 CTAs
    assert fragment_gemm.gemv_tile(64, 96, 2048, HOPPER_SHARED) == (32, 2, 8, 1, 0, 1)  # 1536 rows
    assert fragment_gemm.gemv_tile(20, 96, 2048, HOPPER_SHARED) == (32, 2, 8, 1, 0, 1)
    assert fragment_gemm.gemv_tile(1, 512, 7168, HOPPER_SHARED) == (8, 2, 16, 2, 0, 1)
    assert fragment_gemm.gemv_tile(8, 512, 4096, HOPPER_SHARED) == (8, 2, 16, 2, 0, 1)
    assert fragment_gemm.gemv_tile(8, 254, 7168, HOPPER_SHARED) == (8, 4, 8, 1, 0, 1)  # 127 CTAs of two
    assert fragment_gemm.gemv_tile(9, 4096, 7168, HOPPER_SHARED) == (16, 2, 8, 2, 0, 1)
    assert fragment_gemm.gemv_tile(16, 96, 2048, HOPPER_SHARED, staged=False) == (16, 2, 8, 1, 0, 1)
    assert fragment_gemm.gemv_tile(0.5, 512, 4096, HOPPER_SHARED) == (8, 2, 16, 2, 0, 1)
    assert fragment_gemm.gemv_tile(4097, 2, 4096, HOPPER_SHARED) == (32, 2, 8, 1, 0, 1)  # never more groups than N has


def test_grouped_products_keep_one_column_group_per_cta():
    for rows, groups in ((0.5, 512), (4.5, 4096), (12, 256), (30, 9496)):
        tile = fragment_gemm.gemv_tile(rows, groups, 4096, HOPPER_SHARED, grouped=True)
        assert fragment_gemm.cta_column_groups(tile) == 1, (rows, groups)


def test_gemv_gives_up_column_groups_before_k_and_then_the_product():
    # K = 14336: 28 chunks x 32 rows x 64 columns x 4 bytes = 229376 fits with four groups
    assert fragment_gemm.cta_column_groups(fragment_gemm.gemv_tile(32, 512, 14336, HOPPER_SHARED)) == 4
    assert fragment_gemm.cta_column_groups(fragment_gemm.gemv_tile(32, 512, 14336 + 512, HOPPER_SHARED)) == 1
    assert fragment_gemm.cta_column_groups(fragment_gemm.gemv_tile(32, 512, 113 * 512, HOPPER_SHARED)) == 1
    assert fragment_gemm.gemv_tile(32, 512, 114 * 512, HOPPER_SHARED) is None
    assert fragment_gemm.gemv_tile(32, 512, 12288, 48 * 1024) == (32, 2, 8, 1, 0, 1)  # without opting in: 12 K


def test_gemv_takes_a_staged_tile_for_dense_products_up_to_the_size_threshold():
    assert fragment_gemm.STAGED_MAX_ELEMENTS == 4096 * 4096  # weight elements, N x K
    assert fragment_gemm.gemv_tile(1, 256, 4096, HOPPER_SHARED) == (8, 4, 16, 2, 1, 1)  # 4096 x 4096: the limit
    assert fragment_gemm.gemv_tile(1, 257, 4096, HOPPER_SHARED) == (8, 2, 16, 2, 0, 1)  # one column group over
    assert fragment_gemm.gemv_tile(8, 128, 4096, HOPPER_SHARED) == (8, 4, 8, 1, 1, 1)  # 64 CTAs of two: one group
    assert fragment_gemm.gemv_tile(16, 256, 2048, HOPPER_SHARED) == (16, 4, 8, 2, 1, 1)
    assert fragment_gemm.gemv_tile(9, 96, 2048, HOPPER_SHARED) == (16, 4, 8, 1, 1, 1)
    assert fragment_gemm.gemv_tile(17, 96, 2048, HOPPER_SHARED)[4] == 0  # no staged tile at 32 rows
    assert fragment_gemm.gemv_tile(1, 256, 4096, HOPPER_SHARED, grouped=True)[4] == 0  # MoE products: never
    assert fragment_gemm.gemv_tile(1, 256, 4096, HOPPER_SHARED, staged=False) == (8, 2, 16, 2, 0, 1)
    # the ring's shared memory on top of the chunk sums: a K whose staged tile no longer fits takes a direct one
    assert fragment_gemm.gemv_tile(1, 1, 400 * 512, HOPPER_SHARED) == (8, 4, 8, 1, 0, 1)
    assert fragment_gemm.gemv_tile(1, 1, 300 * 512, HOPPER_SHARED) == (8, 4, 8, 1, 1, 1)
    # a ring per launched warp (one per chunk of K), not per warp the tile allows: at K = 512 one warp's
    # 4 slots x 1792 bytes + 512 of chunk sums fit 8 KB, eight warps' would not
    assert fragment_gemm.gemv_tile(1, 1, 512, 8192) == (8, 4, 8, 1, 1, 1)
    assert fragment_gemm.gemv_tile(1, 1, 1024, 8192) == (8, 4, 8, 1, 0, 1)


def test_the_shared_memory_planned_for_a_staged_tile_is_what_the_kernel_addresses():
    # the kernel's chunk sums, then one ring of PREFETCH slots of SLOT_BYTES per launched warp (per column
    # warp, one per chunk of K, at most the tile's): SLOT_BYTES read from fragment_gemm.cu, so the two sizes
    # cannot drift apart
    slot = re.search(r"#define SLOT_BYTES (\(.*\))", fragment_gemm.SOURCE.read_text()).group(1)
    for tile in (*fragment_gemm.STAGED_GEMV_TILES, (8, 4, 4, 1, 1, 2), (16, 2, 2, 2, 1, 4)):
        rows, prefetch, warps, groups, _, columns = tile
        slot_bytes = eval(slot.replace("GROUPS", str(groups)).replace("NT", str(rows // 8)))
        for k in (512, 2048, 7168, 20480):
            chunks = -(-k // 512)
            sums = chunks * rows * 16 * groups * columns * 4
            expected = sums + min(chunks, warps) * columns * prefetch * slot_bytes
            assert fragment_gemm.gemv_shared_bytes(tile, k) == expected, (tile, k)


def test_gemm_takes_the_first_tile_that_still_launches_enough_ctas():
    # CTAs = row tiles x column CTAs of warps x groups a warp; the last tile where none launches MIN_GEMM_CTAS
    need = fragment_gemm.MIN_GEMM_CTAS
    for row_tiles, groups in ((1, 1), (1, 256), (2, 512), (3, 512), (4, 512), (16, 96), (128, 512), (1000, 17)):
        tile = fragment_gemm.gemm_tile(row_tiles, groups, HOPPER_SHARED)
        ctas = [row_tiles * fragment_gemm.gemm_column_ctas(groups, t) for t in fragment_gemm.GEMM_TILES]
        index = fragment_gemm.GEMM_TILES.index(tile)
        assert all(c < need for c in ctas[:index]), (row_tiles, groups, tile)
        assert ctas[index] >= need or index == len(ctas) - 1, (row_tiles, groups, tile)
    wide = fragment_gemm.GEMM_TILES[0]
    per_cta = wide[0] * wide[2]
    assert fragment_gemm.gemm_tile(need, per_cta, HOPPER_SHARED) == wide  # one column CTA
    assert fragment_gemm.gemm_tile(need, per_cta + 1, HOPPER_SHARED) == wide  # the last CTA part empty
    assert fragment_gemm.gemm_tile(need - 1, per_cta, HOPPER_SHARED) != wide
    assert fragment_gemm.gemm_tile(1, 1, HOPPER_SHARED) == fragment_gemm.GEMM_TILES[-1]


def test_grouped_products_take_four_warp_ctas_first_where_their_ring_fits():
    assert set(fragment_gemm.GROUPED_GEMM_TILES) == set(fragment_gemm.GEMM_TILES)
    assert fragment_gemm.gemm_tile(1000, 96, HOPPER_SHARED, grouped=True) == (2, 4, 4)
    assert fragment_gemm.gemm_tile(1000, 96, HOPPER_SHARED) == (2, 4, 8)
    ada = 101376  # (2, 4, 4)'s ring does not fit; the one-group tiles come in the dense order
    assert fragment_gemm.gemm_tile(1000, 96, ada, grouped=True) == fragment_gemm.gemm_tile(1000, 96, ada) == (1, 2, 8)


def test_gemm_takes_a_tile_whose_ring_fits_the_shared_memory_of_the_gpu():
    ada = 101376  # bytes a CTA may opt in to on sm_89 (and sm_120)
    assert fragment_gemm.gemm_shared_bytes(fragment_gemm.gemm_tile(1000, 512, HOPPER_SHARED)) > ada
    for row_tiles, groups in ((1, 1), (1000, 512), (4, 96)):
        assert fragment_gemm.gemm_shared_bytes(fragment_gemm.gemm_tile(row_tiles, groups, ada)) <= ada
    with pytest.raises(ValueError, match="no tile's ring fits"):
        fragment_gemm.gemm_tile(1000, 512, 32 * 1024)


def test_the_shared_memory_planned_for_gemm_is_what_the_kernel_addresses():
    # GEMM_STAGES stages of STAGE_BYTES, the macros read from fragment_gemm.cu
    text = fragment_gemm.SOURCE.read_text()
    macros = dict(re.findall(r"#define (STEP|X_STRIDE|W_BYTES|STAGE_BYTES) (\d+|\(.*?\))\s", text))
    for groups, stages, warps in ((1, 2, 8), (1, 4, 8), (2, 3, 8), (2, 4, 8), (1, 2, 4), (2, 4, 4)):
        values = {"TILE_ROWS": fragment_gemm.GEMM_ROWS, "WARPS": warps, "GEMM_GROUPS": groups}
        for name in ("STEP", "X_STRIDE", "W_BYTES", "STAGE_BYTES"):
            expression = macros[name]
            for known, value in values.items():
                expression = re.sub(rf"\b{known}\b", str(value), expression)
            values[name] = eval(expression)
        assert fragment_gemm.gemm_shared_bytes((groups, stages, warps)) == stages * values["STAGE_BYTES"]
    assert all(fragment_gemm.gemm_shared_bytes(tile) <= HOPPER_SHARED for tile in fragment_gemm.GEMM_TILES)


def test_a_tile_of_the_other_kernel_is_refused():
    with pytest.raises(ValueError, match="not a tile of that kernel"):
        fragment_gemm.launch(None, None, None, None, None, rows_per_matrix=1, gemv=False, tile=(8, 2, 16, 2, 0, 1))
    with pytest.raises(ValueError, match="not a tile of that kernel"):
        fragment_gemm.launch(None, None, None, None, None, rows_per_matrix=1, gemv=True, tile=(2, 4, 8))


def test_column_warps_count_as_column_groups_of_the_cta():
    # four column warps of one group: 128 CTAs on 8192 columns, as four groups of one warp
    assert fragment_gemm.cta_column_groups((32, 2, 4, 1, 0, 4)) == 4
    assert fragment_gemm.cta_column_groups((16, 2, 4, 2, 0, 2)) == 4
    assert fragment_gemm._gemv_warps((32, 2, 4, 1, 0, 4), 7168) == 16  # 4 of 14 chunks x 4 columns
    assert fragment_gemm._gemv_warps((32, 2, 8, 1, 0, 4), 1024) == 8  # 2 chunks x 4 columns
    assert fragment_gemm.tile_builds((8, 1, 8, 1, 0, 4)) and fragment_gemm.tile_builds((8, 1, 16, 1, 0, 2))
    assert not fragment_gemm.tile_builds((8, 1, 16, 1, 0, 4))  # 64 warps: past a CTA's 32
    assert not fragment_gemm.tile_builds((8, 1, 4, 1, 0, 0)) and not fragment_gemm.tile_builds((8, 1, 4, 0, 0, 1))
    # rows in whole n8 tiles: a CTA of 12 would be launched 12 rows apart and compute 8
    assert not fragment_gemm.tile_builds((12, 2, 8, 1, 0, 1)) and not fragment_gemm.tile_builds((7, 2, 8, 1, 0, 1))
    assert not fragment_gemm.tile_builds((8, 2, 8, 1, 0)) and not fragment_gemm.tile_builds((8.0, 2, 8, 1, 0, 1))
    assert not fragment_gemm.tile_builds((8, 2, 8, True, 0, 1))  # bool is an int subclass, not a count


def test_a_gemm_tile_builds_only_with_three_integer_counts_a_ring_that_fits_and_known_warps():
    assert fragment_gemm.gemm_tile_builds((2, 4, 8)) and fragment_gemm.gemm_tile_builds((1, 8, 8))
    assert fragment_gemm.gemm_tile_builds((1, 2, 4)) and fragment_gemm.gemm_tile_builds((2, 4, 4))
    assert not fragment_gemm.gemm_tile_builds((2, 7, 8))  # 258 048 bytes: past any GPU's 227 KB
    bad_tiles = ((3, 4, 8), (0, 4, 8), (2, 1, 8), (-1, 4, 8), (2, 4), (2, 4, 8, 1), (1.0, 2, 8), (2, 2.5, 8))
    warps = ((1, 2, 1), (1, 2, 2), (1, 2, 3), (1, 2, 16), (1, 2, 8.0))  # GEMM_WARPS: 4 or 8
    for bad in (*bad_tiles, *warps, (True, 2, 4), (1, True, 8)):  # bool is an int subclass, not a count
        assert not fragment_gemm.gemm_tile_builds(bad), bad
    with pytest.raises(ValueError, match="no product to tile"):
        fragment_gemm.gemm_tile(0, 512, HOPPER_SHARED)
    with pytest.raises(ValueError, match="no product to tile"):
        fragment_gemm.gemm_tile(4, 0, HOPPER_SHARED)


def test_grouped_row_tiles_are_built_for_the_rows_of_the_tile_gemv_takes():
    for rows in (1, 8, 9, 16, 17, 32, 96, 500):
        for groups in (1, 96, 256, 512, 9496):
            tile = fragment_gemm.gemv_tile(rows, groups, 7168, HOPPER_SHARED, grouped=True)
            assert tile[0] == fragment_gemm.rows_per_cta(rows, gemv=True), (rows, groups, tile)


def test_every_row_count_of_the_gemv_tiles_ends_with_a_one_group_tile():
    for size in {tile[0] for tile in fragment_gemm.GEMV_TILES}:
        last = [tile for tile in fragment_gemm.GEMV_TILES if tile[0] == size][-1]
        assert fragment_gemm.cta_column_groups(last) == 1, size


@pytest.mark.gpu
@pytest.mark.parametrize("tile", TEST_TILES)
@pytest.mark.parametrize(
    "m,n,k", [(1, 200, 528), (9, 136, 2112), (31, 48, 96), (33, 1040, 7168), (20, 72, 3072), (8, 48, 8192)]
)
def test_every_gemv_tile_gives_the_reference_bits(tile, m, n, k):
    qx, qw = _operands(m, n, k, seed=n + m)
    prepared = gemm.with_fragments(qw)
    for out_dtype in (torch.float32, torch.bfloat16):
        y = gpu_gemm.fragment_matmul(qx, prepared, out_dtype, gemv=True, tile=tile)
        assert_same_bits(block_gemm.matmul(_cpu(qx), _cpu(qw), out_dtype), y, f"gemv {tile}")


GEMM_TEST_TILES = sorted(
    set(fragment_gemm.GEMM_TILES) | {(1, 2, 8), (1, 3, 8), (2, 2, 8), (2, 3, 8), (2, 4, 4), (1, 3, 4), (2, 2, 4)}
)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", GEMM_TEST_TILES)
@pytest.mark.parametrize(
    "m,n,k", [(1, 48, 96), (65, 200, 528), (130, 560, 2112), (64, 16, 1040), (100, 4112, 2064), (3, 72, 8192)]
)
def test_every_gemm_tile_gives_the_reference_bits(tile, m, n, k):
    """Column groups that fill no CTA or part of its last one, rows off the 64-row tile, K ending inside a step
    (one quad of two) and inside a quad, K shorter than the ring and one step long."""
    qx, qw = _operands(m, n, k, seed=n + k)
    prepared = gemm.with_fragments(qw)
    for out_dtype in (torch.float32, torch.bfloat16):
        y = gpu_gemm.fragment_matmul(qx, prepared, out_dtype, gemv=False, tile=tile)
        assert_same_bits(block_gemm.matmul(_cpu(qx), _cpu(qw), out_dtype), y, f"gemm {tile}")


HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the warpgroup-MMA gemm needs a Hopper GPU (sm_90a)")
@pytest.mark.parametrize(
    "m,n,k", [(1, 48, 96), (130, 560, 2112), (128, 128, 512), (200, 4112, 2064), (3, 72, 8192), (257, 1040, 7168)]
)
@pytest.mark.parametrize("swizzle", fragment_gemm.WGMMA_SWIZZLES)
def test_the_wgmma_gemm_gives_the_reference_bits(m, n, k, swizzle):
    """Rows off the 128-row tile, column groups that fill no CTA or part of one, K ending inside a step and a
    quad, K of one step, chunks of K ending inside a step; under every shared-memory layout."""
    qx, qw = _operands(m, n, k, seed=n + k + 1)
    prepared = gemm.with_fragments(qw)
    for out_dtype in (torch.float32, torch.bfloat16):
        y = gpu_gemm.wgmma_matmul(qx, prepared, out_dtype, swizzle=swizzle)
        assert_same_bits(block_gemm.matmul(_cpu(qx), _cpu(qw), out_dtype), y, f"wgmma, swizzle {swizzle}")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", GEMM_TEST_TILES)
def test_grouped_gemm_tiles_give_the_reference_bits(tile):
    e, n, k, tokens, top_k = 16, 272, 2064, 200, 4
    qw = _expert_stack(e, n, k, 5)
    prepared = gemm.with_fragments(qw)
    qx = nvfp4.quantize(heavy_tailed((tokens, k), 6).to(DEVICE), scale="per_token", four_over_six="mse")
    experts, rows = _routing(tokens, top_k, used=12)
    ref = block_gemm.grouped_matmul(_cpu(qx), _cpu(qw), experts.cpu(), rows.cpu(), torch.float32)
    y = gpu_gemm.fragment_grouped_matmul(qx, prepared, experts, rows, torch.float32, gemv=False, tile=tile)
    assert_same_bits(ref, y, f"grouped gemm {tile}")


@pytest.mark.gpu
@pytest.mark.parametrize("gemv", [True, False])
def test_grouped_kernels_give_the_reference_bits_on_cuda(gemv):
    e, n, k, tokens, top_k = 16, 96, 2048, 40, 4
    qw = _expert_stack(e, n, k, 7)
    prepared = gemm.with_fragments(qw)
    qx = nvfp4.quantize(heavy_tailed((tokens, k), 8).to(DEVICE), scale="per_token", four_over_six="mse")
    experts, rows = _routing(tokens, top_k, used=12)  # experts 12-15 unused
    for out_dtype in (torch.float32, torch.bfloat16):
        ref = block_gemm.grouped_matmul(_cpu(qx), _cpu(qw), experts.cpu(), rows.cpu(), out_dtype)
        y = gpu_gemm.fragment_grouped_matmul(qx, prepared, experts, rows, out_dtype, gemv=gemv)
        assert_same_bits(ref, y, "fragment grouped")
        assert_same_bits(ref, gpu_gemm.packed_grouped_matmul(qx, qw, experts, rows, out_dtype), "triton grouped")
    # one row per expert, no gather (the down projection's form)
    few = torch.arange(0, 12, 3, device=DEVICE)
    qh = nvfp4.quantize(gaussian((4, k), 9).to(DEVICE), scale="per_token", four_over_six="mse")
    ref2 = block_gemm.grouped_matmul(_cpu(qh), _cpu(qw), few.cpu(), None, torch.float32)
    y2 = gpu_gemm.fragment_grouped_matmul(qh, prepared, few, None, torch.float32, gemv=gemv)
    assert_same_bits(ref2, y2, "fragment grouped, no gather")


@pytest.mark.gpu
def test_fragment_kernels_run_inside_a_cuda_graph():
    qx, qw = _operands(4, 256, 1024, seed=11)
    prepared = gemm.with_fragments(qw)
    out = gpu_gemm.fragment_matmul(qx, prepared, torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        captured = gpu_gemm.fragment_matmul(qx, prepared, torch.bfloat16)
    graph.replay()
    torch.cuda.synchronize()
    assert_same_bits(out.cpu(), captured, "graph replay")


@pytest.mark.gpu
def test_other_output_dtypes_per_tensor_activations_and_long_k_on_cuda():
    """Float16 output (computed in float32 and rounded once, as the reference), per-tensor activation scales,
    and a K too long for gemv's shared memory at 32 rows (256 KB of chunk sums), which the dispatch sends to
    gemm."""
    qx, qw = _operands(5, 72, 528, seed=3)
    prepared = gemm.with_fragments(qw)
    ref = block_gemm.matmul(_cpu(qx), _cpu(qw), torch.float16)
    assert_same_bits(ref, gemm.matmul(qx, prepared, out_dtype=torch.float16), "float16")
    x = heavy_tailed((7, 528), 4).to(DEVICE)
    per_tensor = nvfp4.quantize(x, scale="per_tensor", four_over_six="mse")
    assert_same_bits(block_gemm.matmul(_cpu(per_tensor), _cpu(qw)), gemm.matmul(per_tensor, prepared), "per tensor")
    qx, qw = _operands(20, 48, 65536, seed=5)
    prepared = gemm.with_fragments(qw)
    assert not fragment_gemm.gemv_fits(20, 65536, qx.device)
    assert_same_bits(block_gemm.matmul(_cpu(qx), _cpu(qw)), gemm.matmul(qx, prepared), "long K through gemm")
    with pytest.raises(ValueError, match="shared memory"):
        gpu_gemm.fragment_matmul(qx, prepared, torch.float32, gemv=True)
