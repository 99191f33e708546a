"""The NVFP4 GEMMs on CUDA: two kernels (``fragment_gemm.cu``) over weights in the fragment layout
(:mod:`nibble.kernels.fragments`), compiled at first use with NVRTC through PyTorch.

Both compute the block-ordered sum of docs/design.md §2.6, so they give a row the same bits as each other,
as the Triton kernel and as the CPU reference, whatever the row count. ``gemv`` serves few rows per weight
(a sampler's decode step): each thread loads 16 bytes holding its part of four blocks and decodes them with
one to three integer operations per pair of codes, straight into tensor-core registers, and K is split over
the warps of a CTA. ``gemm`` serves many rows (prefill, the trainer): 64 activation rows at a time are
streamed through a ring of shared-memory stages, with the weights, and shared by the CTA's warps (four or
eight), each decoding one or two 16-row groups of the weight (:data:`GEMM_TILES`).

Needs a GPU with compute capability ≥ 8.9 (the E4M3 conversion instruction: Ada, Hopper, Blackwell) and
PyTorch's NVRTC binding (``torch.cuda._compile_kernel``); where either is missing :func:`available` is
False and the Triton kernel serves every shape.
"""

from __future__ import annotations

import functools
import logging
import operator
import pathlib

import torch

from ..fragments import NVFP4Fragments
from ..reference import block_gemm

SOURCE = pathlib.Path(__file__).with_name("fragment_gemm.cu")
CHUNK_QUADS = block_gemm.CHUNK_BLOCKS // 4  # docs/design.md §2.6's chunk, in quads of 4 blocks
GemvTile = tuple[int, int, int, int, int, int]  # the fields GEMV_TILES' comment names, in its order
# gemv tiles: (activation rows per CTA, quads whose loads a warp issues together, warps splitting K at most, column
# groups per warp, staged, column warps: warps side by side along N, each with its own column groups), by rows
# per CTA and, within them, in order of preference. Launch parameters only (every choice gives the same bits),
# from benchmarks/gemm_backends_gpu.py --sweep: h200_gemm_sweep.json, then on the H100
# h100_gemv_column_groups_sweep.json (four column groups at 32 rows), h100_gemv_warps16_sweep.json (--warps 8 16:
# two groups over 16 warps at 8 rows, one chunk of K per warp up to K = 8192), h100_gemv_warps4_8_sweep.json
# (--warps 4 8: the one-group 32-row tile takes 8 warps, which at K <= 2048 launches as the 4-warp tile it
# replaced) and h100_gemv_column_warps_32rows_sweep.json (the CTA's four column groups as two column warps of
# two groups: 2-7% faster than one warp of four at 33-64 rows; column warps lost at 1 and 8 rows, tied at 16,
# h100_gemv_column_warps_sweep.json).
GEMV_TILES = (
    (8, 2, 16, 2, 0, 1), (8, 4, 8, 1, 0, 1),
    (16, 2, 8, 2, 0, 1), (16, 2, 8, 1, 0, 1),
    (32, 2, 8, 2, 0, 2), (32, 2, 8, 1, 0, 1),
)  # fmt: skip
# A tile of several column groups serves only products that still launch this many CTAs (row tiles × column
# CTAs). H100, h100_gemv_column_groups_sweep.json, 32 rows per CTA: 8192 x 7168 at M = 32 (four groups: 128 CTAs)
# 35.7 us against 47.8 with one group; 4096 x 4096 at M = 64 (128 CTAs) 21.5 against 30.7, but at M = 32 (64 CTAs) 21.1
# against 16.9; 1536 x 2048 always one group. Grouped products keep one group per CTA: their CTA count is set
# on the device by the routing, and several groups were never swept for them.
MIN_COLUMN_GROUP_CTAS = 128
# Staged tiles (the kernel's STAGE form: operands streamed through a cp.async ring of PREFETCH quads), tried
# before GEMV_TILES for dense products of at most STAGED_MAX_ELEMENTS weight elements. H100,
# benchmarks/gemv_staged_gpu.py (h100_gemv_staged.json: each beside the direct tile in one run), 1 / 8 / 16 rows:
# the direct tile takes 1.19-1.35x the staged one's time on 4096 x 2048, 2048 x 4096, 1536 x 2048 and
# 512 x 2048 (but 1.12x at 16 rows on 2048 x 4096), 1.15 / 1.13 / 1.02x on 4096 x 4096 (2^24 elements); past the
# limit 0.95 / 0.88 / 0.79x on 6144 x 4096, 0.98 / 0.91 / 0.72x on 8192 x 4096 and 0.78 / 0.78 / 0.73x on
# 8192 x 7168, whose weight reads keep DRAM busy enough that the ring's extra instructions cost more than its
# deeper prefetch buys. 32 rows: slower everywhere measured (h100_gemv_staged_ab.log).
STAGED_GEMV_TILES = ((8, 4, 16, 2, 1, 1), (8, 4, 8, 1, 1, 1), (16, 4, 8, 2, 1, 1), (16, 4, 8, 1, 1, 1))
STAGED_MAX_ELEMENTS = 1 << 24
GEMM_ROWS = 64  # activation rows per CTA of gemm: 8 n8 tiles per warp
GEMM_WARPS = (4, 8)  # warps a gemm CTA may have, side by side along N (a thread copies 32 / warps activation pieces)
GemmTile = tuple[int, int, int]  # gemm: (column groups per warp, steps of K in flight: the ring's stages, warps)
# gemm tiles in order of preference: the first whose ring fits a CTA's shared memory and that launches MIN_GEMM_CTAS
# CTAs (row tiles × column CTAs) serves, else the last that fits (the most CTAs). Two groups a warp halve the
# activation reads (shared memory and L2) per tensor-core product but also the CTA count, and hold some 240
# registers a thread (8 warps an SM); one group a warp keeps 16 warps an SM (8 on Ada, whose 99 KB hold one ring of
# eight warps or two of four), and its two stages fit Ada. Four warps a CTA double the CTAs of a product whose
# eight-warp CTAs leave SMs idle (two warps were slower still: (1, 2, 2) lost to (1, 2, 4) at every shape measured).
# Launch parameters only: every tile gives the same bits. H100, benchmarks/gemm_pipeline_gpu.py
# (h100_gemm_tiles.json), us, the tile taken against the best of seven: 8192 x 7168 M = 64 (1, 2, 4) 55.4, its best
# (eight warps 76.3); M = 128 (2, 4, 4) 75.8, best; M = 192 118.8 against 112.0; M = 1024 (2, 4, 8) 455.9 against
# 451.3; 4096 x 4096 M = 64 and 128 (1, 2, 4) 34.0 and 34.3, best (eight warps 46.0 and 46.3); 1536 x 2048 M = 1024
# (2, 4, 4) 39.9 against 37.3.
GEMM_TILES: tuple[GemmTile, ...] = ((2, 4, 8), (2, 4, 4), (1, 2, 8), (1, 2, 4))
# Grouped products (rows sorted by expert, a CTA a tile of one expert's rows) take four-warp CTAs first. Of the
# tiles above, in the 6 grouped rows of h100_gemm_tiles.json that gemm serves (more than gemm.py's
# GROUPED_CROSSOVER_ROWS = 16 rows an expert: 32, 64 and 256, 128 experts of 1536 x 2048 and 2048 x 768), (2, 4, 4)
# was the fastest in 4, level with (1, 2, 8) in a fifth (146.91 against 146.89 us) and 1.7% behind (2, 4, 8) in
# the sixth (1536 x 2048 at 64 rows an expert); in the five, 1.8-4.4% ahead of (2, 4, 8), which grouped products
# took before.
GROUPED_GEMM_TILES: tuple[GemmTile, ...] = ((2, 4, 4), (2, 4, 8), (1, 2, 8), (1, 2, 4))
MIN_GEMM_CTAS = 128
MAX_SHARED_BYTES = 232448  # the most shared memory a CTA can opt in to on any GPU so far (Hopper, Blackwell: 227 KB)

# What tile_builds and gemm_tile_builds accept, in words (error messages).
GEMV_TILE_RULE = (
    "six integers (rows, prefetch, warps, groups, staged, column warps): counts positive, rows a multiple of 8, "
    "staged 0 or 1, a staged tile's prefetch at least 2, warps x column warps at most 32"
)
GEMM_TILE_RULE = (
    f"three integers (groups, stages, warps): 1 or 2 column groups a warp, at least two stages whose ring fits "
    f"{MAX_SHARED_BYTES} bytes, {' or '.join(map(str, GEMM_WARPS))} warps"
)

# The warpgroup-MMA gemm (nvfp4_fragment_wgmma, compiled with WGMMA for sm_90a: Hopper only). Not dispatched: on
# the H100, unswizzled, it gives gemm's bits but is slower than gemm (docs/gpu-kernels.md, the wgmma notes);
# launch_wgmma and gemm.wgmma_matmul call it for the GPU tests and benchmarks/gemm_pipeline_gpu.py --wgmma. A CTA:
# 128 activation rows x 8 column groups, 256 threads.
WGMMA_ROWS = 128
WGMMA_COLUMN_GROUPS = 8
WGMMA_STAGES = 4
# How the wgmma gemm lays a step's activations in shared memory (WG_SWIZZLE of fragment_gemm.cu: no swizzle, or
# wgmma's 32- or 128-byte swizzle). Each is meant to give the same bits: 0 has on the H100; 32 and 128 are emulated
# on the CPU (tests/kernels/test_wgmma_emulation.py) and not yet run on a GPU.
WGMMA_SWIZZLES = (0, 32, 128)
# The element of a 16-element block at each logical K position of the fragment layout's mma operands (lane c holds
# elements 4c..4c+3 where mma.m16n8k16 numbers them 2c, 2c+1, 2c+8, 2c+9): wgmma's B, read from shared memory in
# logical order, needs the activations permuted so within each block.
FRAGMENT_K_ORDER = (0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)

NVRTC_OPTIONS = ("--fmad=false",)  # every float32 add and multiply rounded on its own (docs/design.md §2.6)

_log = logging.getLogger(__name__)


@functools.cache
def available(device_index: int) -> bool:
    """Whether the kernels can run on CUDA device ``device_index`` (compiling them once to find out)."""
    if torch.cuda.get_device_capability(device_index) < (8, 9) or not hasattr(torch.cuda, "_compile_kernel"):
        return False
    try:
        _module(GEMV_TILES[0], GEMM_TILES[-1], False, False, True, device_index)
    except Exception as error:  # NVRTC missing, headers, driver: the Triton kernel still serves
        _log.warning("NVFP4 fragment GEMMs unavailable on cuda:%d (%s); using the Triton kernel", device_index, error)
        return False
    return True


def _rows_per_cta(rows: float) -> int:
    """The fewest rows per CTA of :data:`GEMV_TILES` that cover ``rows`` (the most, beyond them)."""
    sizes = sorted({tile[0] for tile in GEMV_TILES})
    return next((size for size in sizes if rows <= size), sizes[-1])


def gemv_tile(
    rows: float, groups: int, k: int, shared_bytes: int, grouped: bool = False, staged: bool = True
) -> GemvTile | None:
    """gemv's tile for ``rows`` activation rows per weight matrix of ``groups`` column groups (N / 16) and
    ``k``: the first entry of ``rows``' rows per CTA — among :data:`STAGED_GEMV_TILES` then :data:`GEMV_TILES` for a
    dense product (not ``grouped``) of at most :data:`STAGED_MAX_ELEMENTS` weight elements, else among
    :data:`GEMV_TILES` — that takes one column group or, for a dense product of at least as many groups, still
    launches :data:`MIN_COLUMN_GROUP_CTAS` CTAs (row tiles × column CTAs), and whose shared memory fits
    ``shared_bytes`` (:func:`shared_limit`); None where none does (then gemm serves). ``staged`` False leaves
    the staged tiles out (benchmarks time both)."""
    size = _rows_per_cta(rows)
    row_tiles = -(-rows // size)
    staged = staged and not grouped and groups * 16 * k <= STAGED_MAX_ELEMENTS
    for tile in (STAGED_GEMV_TILES if staged else ()) + GEMV_TILES:
        if tile[0] != size or gemv_shared_bytes(tile, k) > shared_bytes:
            continue
        column_groups = cta_column_groups(tile)
        ctas = row_tiles * -(-groups // column_groups)
        if column_groups == 1 or (not grouped and groups >= column_groups and ctas >= MIN_COLUMN_GROUP_CTAS):
            return tile
    return None


def cta_column_groups(tile: GemvTile) -> int:
    """Column groups (16 output columns each) one gemv CTA of ``tile`` covers: its column warps' groups."""
    return tile[3] * tile[5]


def _gemv_warps(tile: GemvTile, k: int) -> int:
    """Warps one gemv CTA launches with: per column warp, one per chunk of K, at most the tile's."""
    return min(-(-k // (CHUNK_QUADS * 64)), tile[2]) * tile[5]


def gemv_shared_bytes(tile: GemvTile, k: int) -> int:
    """Shared memory of one gemv CTA, bytes: a float32 sum per chunk of K for its rows × 16 weight rows per
    column group, and for a staged tile each launched warp's ring of ``prefetch`` slots (``SLOT_BYTES`` of
    fragment_gemm.cu: per lane 24 bytes of weight words and scales per group, 32 of activations per n8 tile)."""
    rows, prefetch, _, column_groups, staged, _ = tile
    slot = 32 * (24 * column_groups + 32 * (rows // 8))
    ring = _gemv_warps(tile, k) * prefetch * slot if staged else 0
    return -(-k // (CHUNK_QUADS * 64)) * rows * 16 * cta_column_groups(tile) * 4 + ring


@functools.cache
def _shared_limit(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def shared_limit(device: torch.device) -> int:
    """Shared memory a CTA may opt in to on CUDA ``device``, bytes (227 KB on Hopper, 99 KB on Ada)."""
    return _shared_limit(_index(device))


def tile_fits(tile: GemvTile, k: int, device: torch.device) -> bool:
    """Whether gemv's shared memory for ``tile`` and ``k`` (chunk sums, and a staged tile's rings) fits a CTA's
    on CUDA ``device``."""
    return gemv_shared_bytes(tile, k) <= shared_limit(device)


def gemv_fits(rows_per_matrix: float, k: int, device: torch.device) -> bool:
    """Whether gemv has a tile for ``rows_per_matrix`` rows and ``k`` on CUDA ``device`` whatever the weight's
    width: its one-group tile's chunk sums fit (on Hopper K up to 227 K at 8 rows, 56 K at 32; gemm serves
    longer K)."""
    return gemv_tile(rows_per_matrix, 1, k, shared_limit(device)) is not None


def tile_builds(tile: GemvTile) -> bool:
    """Whether ``tile`` makes a kernel: six integers, its counts (rows, prefetch, warps, groups, column warps)
    positive and its rows whole n8 tiles (a multiple of 8), staged 0 or 1, a staged tile's ring at least two slots
    (``prefetch`` >= 2), and a CTA at most 32 warps (warps × column warps)."""
    if not isinstance(tile, tuple | list) or len(tile) != 6 or not all(type(v) is int for v in tile):
        return False  # not bool, float, or a numpy scalar either
    counts_ok = min(tile[:4] + tile[5:]) >= 1 and tile[0] % 8 == 0 and tile[4] in (0, 1)
    return counts_ok and not (tile[4] and tile[1] < 2) and tile[2] * tile[5] <= 32


def gemm_tile(row_tiles: int, groups: int, shared_bytes: int, grouped: bool = False) -> GemmTile:
    """gemm's tile for ``row_tiles`` CTAs along M (at most, for a grouped product), a weight of ``groups`` column
    groups (N / 16) and ``shared_bytes`` a CTA may take (:func:`shared_limit`): the first of :data:`GEMM_TILES`
    (:data:`GROUPED_GEMM_TILES` for a ``grouped`` product) whose ring fits and that launches :data:`MIN_GEMM_CTAS`
    CTAs, else the last whose ring fits.

    Raises:
        ValueError: counts that are not integers; no rows or no column groups; no tile's ring fits ``shared_bytes``.
    """
    try:
        row_tiles, groups, shared_bytes = (operator.index(v) for v in (row_tiles, groups, shared_bytes))
    except TypeError:
        raise ValueError(
            f"fragment gemm: row tiles, column groups and shared bytes are integers, not {row_tiles!r}, {groups!r}, "
            f"{shared_bytes!r}"
        ) from None
    if row_tiles < 1 or groups < 1:
        raise ValueError(f"fragment gemm: {row_tiles} row tiles of {groups} column groups is no product to tile")
    fitting = [
        tile for tile in (GROUPED_GEMM_TILES if grouped else GEMM_TILES) if gemm_shared_bytes(tile) <= shared_bytes
    ]
    if not fitting:
        raise ValueError(f"fragment gemm: no tile's ring fits {shared_bytes} bytes of shared memory")
    enough = (tile for tile in fitting if gemm_ctas(row_tiles, groups, tile) >= MIN_GEMM_CTAS)
    return next(enough, fitting[-1])


def gemm_column_ctas(groups: int, tile: GemmTile) -> int:
    """gemm CTAs along N for a weight of ``groups`` column groups: each covers its warps' groups."""
    return -(-groups // (tile[2] * tile[0]))


def gemm_ctas(row_tiles: int, groups: int, tile: GemmTile) -> int:
    """CTAs gemm launches with ``tile`` for ``row_tiles`` tiles of 64 rows and ``groups`` column groups."""
    return row_tiles * gemm_column_ctas(groups, tile)


def gemm_shared_bytes(tile: GemmTile) -> int:
    """Shared memory of one gemm CTA, bytes: per stage, the step's 128 elements of K for its 64 rows (288 bytes
    a row with the bank pad: ``X_STRIDE`` of fragment_gemm.cu) and each warp's weight words and scales (576
    bytes per group and quad, ``W_BYTES``)."""
    groups, stages, warps = tile
    return stages * (GEMM_ROWS * 288 + warps * groups * 2 * 576)


def gemm_tile_builds(tile: GemmTile) -> bool:
    """Whether ``tile`` makes a gemm kernel: three integers, one or two column groups a warp (a warp's 32 lanes copy
    the step's 16 scale pairs per group), a ring of at least two stages that fits the most shared memory a CTA
    can have on any GPU (:data:`MAX_SHARED_BYTES`) and warps among :data:`GEMM_WARPS`."""
    if not isinstance(tile, tuple | list) or len(tile) != 3 or not all(type(v) is int for v in tile):
        return False  # not bool, float, or a numpy scalar either
    groups, stages, warps = tile
    return groups in (1, 2) and stages >= 2 and warps in GEMM_WARPS and gemm_shared_bytes(tile) <= MAX_SHARED_BYTES


def source(tile: GemvTile, grouped: bool, gather: bool, bf16: bool, gemm: GemmTile = GEMM_TILES[-1]) -> str:
    """The CUDA source of both kernels for one gemv tile, one gemm tile and one operand form: :data:`SOURCE`
    after the ``#define`` lines of its macros.

    Raises:
        ValueError: a tile that makes no kernel (:func:`tile_builds`, :func:`gemm_tile_builds`).
    """
    if not tile_builds(tile):
        raise ValueError(f"gemv tile {tile}: {GEMV_TILE_RULE}")
    if not gemm_tile_builds(gemm):
        raise ValueError(f"gemm tile {gemm}: {GEMM_TILE_RULE}")
    rows, prefetch, warps, column_groups, staged, column_warps = tile
    defines = {
        "NT": rows // 8,
        "PREFETCH": prefetch,
        "GROUPS": column_groups,
        "COLUMN_WARPS": column_warps,
        "WARPS": gemm[2],
        "TILE_ROWS": GEMM_ROWS,
        "GEMM_GROUPS": gemm[0],
        "GEMM_STAGES": gemm[1],
        "CHUNK_QUADS": CHUNK_QUADS,
        "GROUPED": int(grouped),
        "GATHER": int(gather),
        "OUT_BF16": int(bf16),
        "MAX_THREADS": 32 * max(warps * column_warps, gemm[2]),
        "STAGE": int(staged),
    }
    return "".join(f"#define {name} {value}\n" for name, value in defines.items()) + SOURCE.read_text()


@functools.cache
def _module(tile: GemvTile, gemm: GemmTile, grouped: bool, gather: bool, bf16: bool, device_index: int):
    """``(gemv, gemm)`` compiled for one gemv tile, one gemm tile and one operand form; gemv may take as much
    shared memory as a CTA can opt in to, gemm its tile's ring (set once here, so a captured CUDA graph never sees
    the limit change; a kernel's static shared memory counts against the same limit)."""
    text = source(tile, grouped, gather, bf16, gemm)
    with torch.cuda.device(device_index):
        gemv_kernel = torch.cuda._compile_kernel(text, "nvfp4_fragment_gemv", nvcc_options=list(NVRTC_OPTIONS))
        gemm_kernel = torch.cuda._compile_kernel(text, "nvfp4_fragment_gemm", nvcc_options=list(NVRTC_OPTIONS))
        gemv_kernel.set_shared_memory_config(_shared_limit(device_index))
        gemm_kernel.set_shared_memory_config(gemm_shared_bytes(gemm))
    return gemv_kernel, gemm_kernel


def wgmma_shared_bytes(stages: int) -> int:
    """Shared memory of one wgmma CTA, bytes: per stage the step's 128 elements of K for its 128 rows (``WG_X_BYTES``
    of fragment_gemm.cu) and its eight warps' weight words and scales (``WG_W_BYTES`` each)."""
    return stages * (8 * 2 * WGMMA_ROWS * 16 + WGMMA_COLUMN_GROUPS * 2 * 576)


def check_swizzle(swizzle: int) -> None:
    """Raises ValueError unless ``swizzle`` is one of :data:`WGMMA_SWIZZLES` (an int, not a bool or a string)."""
    if type(swizzle) is not int or swizzle not in WGMMA_SWIZZLES:
        raise ValueError(f"fragment wgmma: swizzle {swizzle!r}, not one of {WGMMA_SWIZZLES} (bytes)")


def wgmma_source(stages: int, swizzle: int, bf16: bool) -> str:
    """The CUDA source with the wgmma kernel enabled (:data:`SOURCE` after its macros), for sm_90a.

    Raises:
        ValueError: ``stages`` not an int of at least 2; ``swizzle`` not among :data:`WGMMA_SWIZZLES` (the
            preprocessor would read a name as 0); ``bf16`` not a bool.
    """
    if type(stages) is not int or stages < 2:
        raise ValueError(f"fragment wgmma: {stages!r} stages, not an int of at least 2 (the ring)")
    check_swizzle(swizzle)
    if type(bf16) is not bool:
        raise ValueError(f"fragment wgmma: bf16 {bf16!r}, not a bool")
    defines = f"#define WGMMA 1\n#define WG_STAGES {stages}\n#define WG_SWIZZLE {swizzle}\n"
    return defines + source(GEMV_TILES[0], False, False, bf16)


@functools.cache
def _wgmma_module(stages: int, swizzle: int, bf16: bool, device_index: int):
    with torch.cuda.device(device_index):
        kernel = torch.cuda._compile_kernel(
            wgmma_source(stages, swizzle, bf16), "nvfp4_fragment_wgmma", compute_capability="90a",
            nvcc_options=list(NVRTC_OPTIONS),
        )  # fmt: skip
        kernel.set_shared_memory_config(wgmma_shared_bytes(stages))
    return kernel


def launch_wgmma(
    x: torch.Tensor,
    x_g: torch.Tensor,
    fragments: NVFP4Fragments,
    w_g: torch.Tensor,
    out: torch.Tensor,
    *,
    stages: int = WGMMA_STAGES,
    swizzle: int = 0,
) -> None:
    """The warpgroup-MMA gemm of one dense weight into ``out [M, N]`` (float32 or bfloat16), on ``x``'s device.

    Args:
        x: float16 ``[M, K]`` activations decoded without their global scale, each 16-element block's elements in
            :data:`FRAGMENT_K_ORDER`; ``x_g`` float32 ``[M]``.
        fragments: the weight ``[N, K]`` in the fragment layout; ``w_g`` float32 ``[1]``.
        stages: steps of K in flight (the ring); ``swizzle``: the activations' shared-memory layout, one of
            :data:`WGMMA_SWIZZLES` (a speed choice, meant to give the same bits: only 0 has run on a GPU).
    Raises:
        ValueError: not a Hopper GPU (compute capability 9.0); an expert stack; a ring that does not fit; a swizzle
            not among :data:`WGMMA_SWIZZLES`; operands of other shapes, dtypes or layouts than the kernel reads.
    """
    check_swizzle(swizzle)  # before the operands or a GPU are looked at
    m = out.shape[0]
    if x.dtype != torch.float16 or tuple(x.shape) != (m, fragments.k) or not x.is_contiguous():
        raise ValueError(
            f"fragment wgmma: activations {x.dtype} {tuple(x.shape)}, not contiguous float16 [{m}, {fragments.k}]"
        )
    if x_g.dtype != torch.float32 or x_g.numel() != m or w_g.dtype != torch.float32 or w_g.numel() != 1:
        raise ValueError(
            f"fragment wgmma: global scales {tuple(x_g.shape)} and {tuple(w_g.shape)}, not float32 [{m}] and [1]"
        )
    if (
        tuple(out.shape) != (m, fragments.n)
        or not out.is_contiguous()
        or out.dtype not in (torch.float32, torch.bfloat16)
    ):
        raise ValueError(
            f"fragment wgmma: output {out.dtype} {tuple(out.shape)}, not contiguous float32 or bfloat16 "
            f"[{m}, {fragments.n}]"
        )
    device_index = _index(x.device)
    if torch.cuda.get_device_capability(device_index) != (9, 0):
        raise ValueError("fragment wgmma: needs a Hopper GPU (compute capability 9.0, sm_90a)")
    if fragments.words.shape[0] != 1:
        raise ValueError(f"fragment wgmma: dense weights only, not a stack of {fragments.words.shape[0]} experts")
    if stages < 2 or wgmma_shared_bytes(stages) > shared_limit(x.device):
        raise ValueError(f"fragment wgmma: {stages} stages ({wgmma_shared_bytes(stages)} bytes) do not fit a CTA")
    kernel = _wgmma_module(stages, swizzle, out.dtype == torch.bfloat16, device_index)
    groups, quads = fragments.words.shape[1:3]
    args = [fragments.words, fragments.scales, w_g, x, x_g, out, m, fragments.n, fragments.k, groups, quads]
    grid = (-(-m // WGMMA_ROWS), -(-groups // WGMMA_COLUMN_GROUPS), 1)
    with torch.cuda.device(x.device):  # a warp a column group
        kernel(grid=grid, block=(32 * WGMMA_COLUMN_GROUPS, 1, 1), args=args, shared_mem=wgmma_shared_bytes(stages))


def _common_args(x, x_g, fragments, w_g, out, x_rows, tiles) -> list:
    unused = x_g
    tile_args = tiles if tiles is not None else (unused,) * 4
    groups, quads = fragments.words.shape[1:3]
    return [
        fragments.words, fragments.scales, w_g, x, x_g, x_rows if x_rows is not None else unused, out,
        *tile_args, out.shape[0], fragments.n, fragments.k, groups, quads,
    ]  # fmt: skip


def launch(
    x: torch.Tensor,
    x_g: torch.Tensor,
    fragments: NVFP4Fragments,
    w_g: torch.Tensor,
    out: torch.Tensor,
    *,
    rows_per_matrix: float,
    gemv: bool,
    x_rows: torch.Tensor | None = None,
    tiles: tuple[torch.Tensor, ...] | None = None,
    grid_rows: int | None = None,
    tile: GemvTile | GemmTile | None = None,
) -> None:
    """Run one of the kernels into ``out [R, N]`` (float32 or bfloat16), on ``x``'s device and current stream.

    Args:
        x: float16 ``[T, K]`` activations decoded without their global scale; ``x_g`` float32 ``[T]``.
        fragments: the weight (``[N, K]`` or an expert stack) in the fragment layout; ``w_g`` float32 ``[E]``.
        rows_per_matrix: rows per weight matrix (M, or rows per expert), which sets the gemv tile.
        gemv: the decode kernel (else the many-row one).
        x_rows: int64 ``[R]`` activation row of each output row (grouped products), or None.
        tiles: ``(tile_expert, tile_start, tile_end, num_tiles)`` int32 device tensors of a grouped product,
            built for the kernel's rows per CTA (:func:`rows_per_cta`); ``grid_rows`` its tile count bound.
        tile: a tile other than the default of the kernel launched, :func:`gemv_tile`'s or :func:`gemm_tile`'s
            (benchmarks sweep them).
    Raises:
        ValueError: ``gemv`` for a K whose chunk sums (and rings) do not fit its shared memory (:func:`gemv_fits`);
            a gemm ``tile`` whose ring does not; a ``tile`` of the other kernel's form.
    """
    tile = tuple(tile) if tile is not None else None  # a list would not key the compiled modules' cache
    if tile is not None and len(tile) != (len(GEMV_TILES[0]) if gemv else len(GEMM_TILES[0])):
        raise ValueError(f"fragment {'gemv' if gemv else 'gemm'}: {tile} is not a tile of that kernel")
    device_index = _index(x.device)
    groups = fragments.words.shape[1]
    rows = (tile[0] if tile is not None else _rows_per_cta(rows_per_matrix)) if gemv else GEMM_ROWS
    grid_rows = grid_rows if grid_rows is not None else -(-out.shape[0] // rows)
    if gemv:
        tile = tile or gemv_tile(
            rows_per_matrix, groups, fragments.k, shared_limit(x.device), grouped=tiles is not None
        )
        if tile is None or not tile_fits(tile, fragments.k, x.device):
            raise ValueError(f"fragment gemv: K = {fragments.k} needs more shared memory than a CTA has; use gemm")
        gemm = GEMM_TILES[-1]  # gemv's compile: the gemm tile is only a macro there
    else:
        gemm = tile or gemm_tile(grid_rows, groups, shared_limit(x.device), grouped=tiles is not None)
        if gemm_shared_bytes(gemm) > shared_limit(x.device):
            raise ValueError(f"fragment gemm: tile {gemm}'s ring needs more shared memory than a CTA has")
        tile = GEMV_TILES[0]  # gemm's compile: the gemv tile is only a macro there
    gemv_kernel, gemm_kernel = _module(
        tile, gemm, tiles is not None, x_rows is not None, out.dtype == torch.bfloat16, device_index
    )
    args = _common_args(x, x_g, fragments, w_g, out, x_rows, tiles)
    with torch.cuda.device(x.device):  # the launch goes to the current stream of the current device
        if gemv:
            shared = gemv_shared_bytes(tile, fragments.k)
            grid = (grid_rows, -(-groups // cta_column_groups(tile)), 1)
            block = (32 * _gemv_warps(tile, fragments.k), 1, 1)
            gemv_kernel(grid=grid, block=block, args=args, shared_mem=shared)
        else:
            grid = (grid_rows, gemm_column_ctas(groups, gemm), 1)
            gemm_kernel(grid=grid, block=(32 * gemm[2], 1, 1), args=args, shared_mem=gemm_shared_bytes(gemm))


def rows_per_cta(rows_per_matrix: float, gemv: bool) -> int:
    """Activation rows one CTA of the default tiles covers: what a grouped product's tiles must be built for."""
    return _rows_per_cta(rows_per_matrix) if gemv else GEMM_ROWS
