"""Row tiles of a grouped (MoE) product, computed in one Triton launch.

A grouped NVFP4 GEMM gets its rows sorted by expert and splits them into tiles of at most ``block_m``
rows that each lie inside one expert's rows; a program of the GEMM takes one tile. The tile list is built
on the device (no host synchronisation, so a CUDA graph can capture the MoE layer). Written as PyTorch
operators it is some twenty-five small kernels (counts, cumulative sums, a search, gathers, casts), and a
MoE layer builds it twice (gate/up and down projections): at sampler decode, more GPU time than the
expert products' own quantiser. One launch here does it all, with the rows' order used directly: in
sorted ``experts`` the rows of expert ``e`` start where a binary search for ``e`` lands.
"""

import contextlib

import torch
import triton
import triton.language as tl

from .. import backend as _backend

# indices, counts and tile starts are int32: rows and block_m below 2**30 keep every sum in range
_INT32_SAFE = 2**30
# tiles per program (each compared with every expert's cumulative tile count)
_BLOCK_T = 64


@triton.jit
def _lower_bound(experts_ptr, R, value, STEPS: tl.constexpr):
    """The first index ``i`` in ``[0, R]`` with ``experts[i] >= value``, for each lane of ``value`` (int32),
    by ``STEPS >= bit_length(R)`` halvings of ``[lo, hi)``."""
    lo = tl.zeros(value.shape, dtype=tl.int32)
    hi = tl.zeros(value.shape, dtype=tl.int32) + R
    for _ in tl.static_range(STEPS):
        open_ = lo < hi
        mid = (lo + hi) // 2
        below = tl.load(experts_ptr + mid, mask=open_, other=0) < value
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
    return lo


@triton.jit
def expert_tiles_kernel(
    experts_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    num_tiles_ptr,
    R,
    E,
    MAX_TILES,
    block_m,
    STEPS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Program ``p`` writes tiles ``[p · BLOCK_T, (p + 1) · BLOCK_T)``, each program redoing the per-expert
    searches (``2 · BLOCK_E · STEPS`` loads from L2, cheaper than a second launch).

    For sorted ``experts [R]`` (int64) and ``E`` experts: ``counts[e]`` rows, ``tiles[e] = ceil(counts[e] /
    block_m)``, ``cum[e] = Σ_{e' ≤ e} tiles[e']``; for ``t`` in ``[0, MAX_TILES)``: expert ``x = min(#{e :
    cum[e] ≤ t}, E - 1)``, ``start = first[x] + (t - cum[x] + tiles[x]) · block_m``, ``end = first[x] +
    counts[x]``, all int32; ``num_tiles = cum[E - 1]``. ``BLOCK_E ≥ E``, a power of two (at least 16: no
    one-element vectors for the compiler)."""
    e = tl.arange(0, BLOCK_E)
    first = _lower_bound(experts_ptr, R, e, STEPS)
    counts = tl.where(e < E, _lower_bound(experts_ptr, R, e + 1, STEPS) - first, 0)
    tiles = (counts + block_m - 1) // block_m
    cum = tl.cumsum(tiles, 0)
    if tl.program_id(0) == 0:
        tl.store(num_tiles_ptr, tl.sum(tiles, 0))
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    passed = (cum[None, :] <= t[:, None]) & (e < E)[None, :]
    expert = tl.minimum(tl.sum(passed.to(tl.int32), 1), E - 1)
    tile_first = tl.gather(first, expert, 0)
    tile_count = tl.gather(counts, expert, 0)
    tiles_before = tl.gather(cum - tiles, expert, 0)
    ok = t < MAX_TILES
    tl.store(tile_expert_ptr + t, expert, mask=ok)
    tl.store(tile_start_ptr + t, tile_first + (t - tiles_before) * block_m, mask=ok)
    tl.store(tile_end_ptr + t, tile_first + tile_count, mask=ok)


def expert_tiles(
    experts: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Row tiles of expert-sorted rows, each inside one expert's rows.

    Args:
        experts: int64 ``[R]`` (R < 2³⁰), sorted ascending, values in ``[0, num_experts)`` — not checked (a hot
            path; :func:`nibble.kernels.gemm.grouped_matmul` validates on request): unsorted rows give wrong
            tiles and rows outside that range lie in no tile. CUDA, or the CPU under the Triton interpreter.
        num_experts: ``1 ≤ E < 2³⁰``.
        block_m: rows per tile, ``1 ≤ block_m < 2³⁰``.
    Returns:
        ``(tile_expert, tile_start, tile_end, num_tiles, max_tiles)``: int32 ``[max_tiles]`` arrays (tile
        ``t``'s expert and row span ``[start, end)``, ``start`` a multiple of ``block_m`` past the expert's
        first row), the real tile count as an int32 ``[1]`` device tensor, and its host-side upper bound
        ``cdiv(R, block_m) + E`` (the launch grid). Entries past the real count are not tiles.
    Raises:
        ValueError: ``num_experts`` or ``block_m`` not an int in that range, ``experts`` not int64 ``[R]`` or
            too long, or a CPU tensor without ``TRITON_INTERPRET=1``.
    """
    for name, value in (("num_experts", num_experts), ("block_m", block_m)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < _INT32_SAFE:
            raise ValueError(f"expert tiles need {name} an int in [1, 2**30), got {value!r}")
    if not isinstance(experts, torch.Tensor) or experts.dtype != torch.int64 or experts.dim() != 1:
        raise ValueError(
            f"expert tiles need int64 experts [R], got {getattr(experts, 'dtype', type(experts))} "
            f"{tuple(getattr(experts, 'shape', ()))}"
        )
    r = experts.shape[0]
    if r >= _INT32_SAFE:
        raise ValueError(f"expert tiles index rows in int32: at most 2**30 - 1 rows, got {r}")
    _backend.resolve(experts.device, "triton")  # CUDA, or the CPU under TRITON_INTERPRET=1; else a ValueError
    max_tiles = triton.cdiv(r, block_m) + num_experts
    device = experts.device
    tile_expert, tile_start, tile_end = (torch.empty(max_tiles, dtype=torch.int32, device=device) for _ in range(3))
    num_tiles = torch.empty(1, dtype=torch.int32, device=device)
    # a multiple of 4 halvings: one compilation per 16x range of R, the extra halvings idle (lo == hi)
    steps = -(-max(r.bit_length(), 1) // 4) * 4
    with torch.cuda.device(device) if experts.is_cuda else contextlib.nullcontext():  # Triton: current device
        expert_tiles_kernel[(triton.cdiv(max_tiles, _BLOCK_T),)](
            experts.contiguous(), tile_expert, tile_start, tile_end, num_tiles, r, num_experts, max_tiles, block_m,
            STEPS=steps, BLOCK_E=max(triton.next_power_of_2(num_experts), 16), BLOCK_T=_BLOCK_T,
        )  # fmt: skip
    return tile_expert, tile_start, tile_end, num_tiles, max_tiles
