"""The MoE combine in one Triton launch, with the bits of the fixed-order composition it replaces.

:func:`nibble.recipe.modules.combine_in_expert_order` sums each token's ``top_k`` weighted expert outputs in
float32, from zero, in ascending expert order, and rounds once. Written with PyTorch operators that is an
inverse permutation, a sort, a gather, ``top_k`` float32 adds and a cast — some fifteen launches per MoE
layer, at sampler decode 43 µs against 13 for CUDA's (nondeterministic) ``index_add``, and 5 µs here
(``benchmarks/expert_combine_gpu.py``). Here one program per token and column chunk finds its token's rows
itself: the rows are sorted by ``(expert, routing slot)`` (a stable argsort), so the row holding slot ``f`` is
where a binary search for ``(flat[f], f)`` lands, and a token's rows in ascending order are its experts in
ascending order. The adds
are the composition's — float32 from ``+0``, one slot at a time, each contribution promoted exactly — and the
one rounding is the store's round-to-nearest-even (float32 comes out under the interpreter, which truncates,
and PyTorch rounds it).
"""

import contextlib

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from ..validation import FLOAT_DTYPES

# rows and slots are int32 in the searches
_INT32_SAFE = 2**30
_BLOCK_H = 1024
_NUM_WARPS = 4


@triton.jit
def _row_of_slot(flat_ptr, order_ptr, R, expert, slot, STEPS: tl.constexpr):
    """For each lane, the first row ``r`` in ``[0, R]`` whose key ``(flat[order[r]], order[r])`` is not below
    ``(expert, slot)``: the row holding routing slot ``slot`` when the rows are sorted by that key."""
    lo = tl.zeros(slot.shape, dtype=tl.int32)
    hi = tl.zeros(slot.shape, dtype=tl.int32) + R
    for _ in tl.static_range(STEPS):
        open_ = lo < hi
        mid = (lo + hi) // 2
        # clamped: an entry of ``order`` outside [0, R) (a caller's bug) must not read outside ``flat``
        mid_slot = tl.minimum(tl.maximum(tl.load(order_ptr + mid, mask=open_, other=0), 0), R - 1).to(tl.int32)
        mid_expert = tl.load(flat_ptr + mid_slot, mask=open_, other=0)
        below = (mid_expert < expert) | ((mid_expert == expert) & (mid_slot < slot))
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
    return lo


@triton.jit
def expert_combine_kernel(
    weighted_ptr,
    flat_ptr,
    order_ptr,
    out_ptr,
    R,
    H,
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    STEPS: tl.constexpr,
):
    """Program ``(n, c)`` writes ``out[n, c · BLOCK_H : (c + 1) · BLOCK_H]`` for contiguous ``weighted [R, H]``
    (rows sorted by ``(expert, slot)``), int64 ``flat [R]`` (slot ``n · TOP_K + j`` routed to expert
    ``flat[…]``), int64 ``order [R]`` (row ``r`` holds slot ``order[r]``), ``out [R / TOP_K, H]``;
    ``BLOCK_K ≥ TOP_K`` a power of two."""
    n = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    in_token = j < TOP_K
    slot = n * TOP_K + tl.where(in_token, j, 0)
    expert = tl.load(flat_ptr + slot)
    rows = _row_of_slot(flat_ptr, order_ptr, R, expert, slot, STEPS)
    # the slots' rows are distinct: a row's rank among them is its place in ascending order
    rank = tl.sum(((rows[None, :] < rows[:, None]) & in_token[None, :]).to(tl.int32), 1)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for place in tl.static_range(TOP_K):
        # clamped: an order that is not the stable argsort may tie ranks or miss a row (R), never read past R
        row = tl.minimum(tl.max(tl.where(in_token & (rank == place), rows, 0), 0), R - 1).to(tl.int64)
        acc += tl.load(weighted_ptr + row * H + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + n.to(tl.int64) * H + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def expert_combine(weighted: torch.Tensor, top_k_index: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Each token's ``top_k`` rows of ``weighted`` summed in float32 from zero in ascending expert order and
    rounded once to ``weighted``'s dtype: :func:`nibble.recipe.modules.combine_in_expert_order`'s forward,
    bit for bit (module docstring), in one launch.

    Args:
        weighted: ``[N · k, H]`` float32, bfloat16 or float16, rows sorted by expert: row ``r`` holds routing
            slot ``order[r]``.
        top_k_index: int64 ``[N, k]``, each token's experts.
        order: int64 ``[N · k]``, the stable argsort of ``top_k_index.reshape(-1)`` — not checked (a hot path;
            the composition is the reference): with any other permutation a token may get the wrong rows
            (every read stays inside ``weighted``).
    Returns:
        ``[N, H]`` in ``weighted``'s dtype. CUDA tensors run compiled; CPU tensors only under
        ``TRITON_INTERPRET=1`` (tests).
    Raises:
        ValueError: shapes, dtypes or devices that do not fit, ``N · k ≥ 2³⁰``, or a CPU tensor without
            ``TRITON_INTERPRET=1``.
    """
    for name, t in (("weighted", weighted), ("top_k_index", top_k_index), ("order", order)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"expert combine needs {name} a torch.Tensor, got {type(t).__name__}")
    if weighted.dtype not in FLOAT_DTYPES or weighted.dim() != 2:
        raise ValueError(f"expert combine needs weighted [N*k, H] in {FLOAT_DTYPES}, got {weighted.dtype} "
                         f"{tuple(weighted.shape)}")  # fmt: skip
    if top_k_index.dim() != 2 or top_k_index.shape[1] == 0:
        raise ValueError(f"expert combine needs top_k_index [N, k] with k >= 1, got {tuple(top_k_index.shape)}")
    tokens, top_k = top_k_index.shape
    for name, t in (("top_k_index", top_k_index), ("order", order)):
        if t.dtype != torch.int64 or t.device != weighted.device:
            raise ValueError(f"expert combine needs {name} int64 on {weighted.device}, got {t.dtype} on {t.device}")
    rows = tokens * top_k
    if order.shape != (rows,) or weighted.shape[0] != rows:
        raise ValueError(
            f"expert combine needs order [N*k] and weighted [N*k, H] for top_k_index {tuple(top_k_index.shape)}, "
            f"got {tuple(order.shape)} and {tuple(weighted.shape)}"
        )
    if rows >= _INT32_SAFE:
        raise ValueError(f"expert combine indexes rows in int32: N*k must be below 2**30, got {rows}")
    _backend.resolve(weighted.device, "triton")  # CUDA, or the CPU under TRITON_INTERPRET=1; else a ValueError
    cuda, dtype = weighted.is_cuda, weighted.dtype
    hidden = weighted.shape[1]
    # the interpreter truncates when it casts to bf16 and mishandles bf16 subnormals: float32 in and out there
    out = torch.empty((tokens, hidden), dtype=dtype if cuda else torch.float32, device=weighted.device)
    if tokens == 0 or hidden == 0:
        return out.to(dtype)
    if not cuda:
        weighted = weighted.to(torch.float32)
    # a multiple of 4 halvings: one compilation per 16x range of rows, the extra halvings idle (lo == hi)
    steps = -(-rows.bit_length() // 4) * 4
    grid = (tokens, triton.cdiv(hidden, _BLOCK_H))
    meta = {"TOP_K": top_k, "BLOCK_K": max(triton.next_power_of_2(top_k), 2), "BLOCK_H": _BLOCK_H, "STEPS": steps}
    args = (weighted.contiguous(), top_k_index.contiguous(), order.contiguous(), out, rows, hidden)
    with torch.cuda.device(weighted.device) if cuda else contextlib.nullcontext():  # Triton: the current device
        expert_combine_kernel[grid](*args, **meta, **({"num_warps": _NUM_WARPS} if cuda else {}))
    return out.to(dtype)
