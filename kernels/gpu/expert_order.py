"""The MoE layer's routing order — the stable argsort of the routed experts — in one Triton launch.

A MoE layer sorts its ``N · k`` routing slots by expert (stably, so a token's slots keep their order) and
gathers each sorted row's expert and token. PyTorch does that with a radix sort of int64 keys (several passes)
plus a gather and a division; at sampler decode (``N · k = 512``) the sort alone took 26 µs per layer on the
H200, more than the layer's expert products' quantiser. Here each slot's place is counted directly —
``#{g : flat[g] < flat[f]} + #{g < f : flat[g] == flat[f]}``, which is the stable argsort's inverse
permutation by definition — and the three outputs are written at that place. The count is quadratic in the
slots, so it pays only up to a size measured on the GPU (:data:`MAX_SLOTS`, from
``benchmarks/expert_order_gpu.py``); past it the MoE layer keeps ``torch.argsort``.
"""

import contextlib

import torch
import triton
import triton.language as tl

from .. import backend as _backend

# faster than torch.argsort(stable=True) + gather at every size up to here on the H200, by 1.8x at 2048
# (benchmarks/expert_order_gpu.py; at 4096 the two are even, past it argsort wins)
MAX_SLOTS = 2048
# ranks and slots are int32 in the kernel
_INT32_SAFE = 2**30
_BLOCK_F = 32
_BLOCK_G = 128


@triton.jit
def expert_order_kernel(flat_ptr, order_ptr, experts_ptr, token_ptr, R, TOP_K, BLOCK_F: tl.constexpr,
                        BLOCK_G: tl.constexpr, CHUNKS: tl.constexpr):  # fmt: skip
    """Program ``p`` places slots ``[p · BLOCK_F, (p + 1) · BLOCK_F)`` of int64 ``flat [R]``: at ``rank(f)``,
    ``order[·] = f``, ``experts[·] = flat[f]``, ``token[·] = f // TOP_K`` (all int64). ``CHUNKS · BLOCK_G ≥ R``
    (a compile-time count: the interpreter cannot loop to a runtime bound with NumPy 2)."""
    f = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    ok = f < R
    expert = tl.load(flat_ptr + f, mask=ok, other=0)
    rank = tl.zeros((BLOCK_F,), dtype=tl.int32)
    for chunk in range(CHUNKS):
        g = chunk * BLOCK_G + tl.arange(0, BLOCK_G)
        other = tl.load(flat_ptr + g, mask=g < R, other=0)
        before = (other[None, :] < expert[:, None]) | ((other[None, :] == expert[:, None]) & (g[None, :] < f[:, None]))
        rank += tl.sum((before & (g < R)[None, :]).to(tl.int32), 1)
    tl.store(order_ptr + rank, f.to(tl.int64), mask=ok)
    tl.store(experts_ptr + rank, expert, mask=ok)
    tl.store(token_ptr + rank, (f // TOP_K).to(tl.int64), mask=ok)


def expert_order(top_k_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routing slots sorted by expert, stably: ``order = torch.argsort(flat, stable=True)`` for
    ``flat = top_k_index.reshape(-1)``, with ``flat[order]`` and ``order // k`` — the same integers.

    Args:
        top_k_index: int64 ``[N, k]``, ``k ≥ 1``, ``N · k < 2³⁰``, any values. The work grows as ``(N · k)²``:
            past :data:`MAX_SLOTS` slots ``torch.argsort`` is faster.
    Returns:
        ``(order, experts, token)``, each int64 ``[N · k]``: the slot, its expert and its token for each
        sorted row. CUDA tensors run compiled; CPU tensors only under ``TRITON_INTERPRET=1`` (tests).
    Raises:
        ValueError: ``top_k_index`` not int64 ``[N, k]`` with ``k ≥ 1``, ``N · k ≥ 2³⁰``, or a CPU tensor
            without ``TRITON_INTERPRET=1``.
    """
    if not isinstance(top_k_index, torch.Tensor) or top_k_index.dtype != torch.int64 or top_k_index.dim() != 2:
        raise ValueError(
            f"expert order needs int64 top_k_index [N, k], got {getattr(top_k_index, 'dtype', type(top_k_index))} "
            f"{tuple(getattr(top_k_index, 'shape', ()))}"
        )
    tokens, top_k = top_k_index.shape
    slots = tokens * top_k
    if top_k == 0 or slots >= _INT32_SAFE:
        raise ValueError(f"expert order needs k >= 1 and N*k < 2**30 slots, got [N, k] = [{tokens}, {top_k}]")
    _backend.resolve(top_k_index.device, "triton")  # CUDA, or the CPU under TRITON_INTERPRET=1; else a ValueError
    order, experts, token = torch.empty((3, slots), dtype=torch.int64, device=top_k_index.device)
    if slots:
        # a power of two: one compilation per 2x range of slots, the extra chunks masked out
        chunks = triton.next_power_of_2(triton.cdiv(slots, _BLOCK_G))
        args = (top_k_index.contiguous(), order, experts, token, slots, top_k)
        with torch.cuda.device(order.device) if order.is_cuda else contextlib.nullcontext():  # Triton: current device
            expert_order_kernel[(triton.cdiv(slots, _BLOCK_F),)](
                *args, BLOCK_F=_BLOCK_F, BLOCK_G=_BLOCK_G, CHUNKS=chunks
            )
    return order, experts, token
