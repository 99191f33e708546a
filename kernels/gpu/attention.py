"""Row-invariant causal attention in Triton: a query row's result does not depend on how it is batched.

The bit-exact logprob contract (docs/design.md) compares a token's logprob as the sampler computes it (one
query row per sequence and step, over a KV cache that may be a static buffer longer than the sequence,
prompts left-padded to the sampler batch's longest) with the trainer's (whole sequences at once, padded to
the training batch's longest prompt). A vendor attention picks its kernel, tiles and split of the key axis
by shape, so those results differ in the last bits. Here a row's arithmetic is the same in every call:

- one BLOCK_M, BLOCK_N, num_warps and dot precision for every shape (no autotuning);
- the key axis of sequence ``b`` is walked in blocks of BLOCK_N starting at its first real key
  ``key_start[b]``, so the same real keys occupy the same slots of the same blocks whatever the padding
  in front of them or the length of the key buffer behind them;
- a key that a row does not attend to (padding, the future, a buffer slot not yet written) gets the score
  ``-inf`` and so the weight ``exp2(-inf) = 0``: an exact zero in the row's sums; a block with no
  attended key leaves the row's running max, sum and accumulator exactly as they were (the rescale factor
  is forced to 1 when the max does not move, and the max is taken as 0 while it is still ``-inf``);
- the online softmax (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; the flash
  attention loop of Dao et al. 2022) keeps float32 running max, sum and accumulator per row and divides
  once at the end. Exponentials are ``exp2`` of scores pre-multiplied by ``log2(e) / sqrt(D)``.

Dot products: scores ``q @ kᵀ`` take the operands as they are (bf16 x bf16 products are exact in float32,
accumulated in float32 by the tensor cores; float32 operands at ``ieee`` precision), weights ``p @ v`` keep
``p`` in float32 at ``tf32x3`` precision (bf16 ``v`` is exact in tf32; ``p`` is carried to ~21 bits) or
``ieee`` for float32 operands. No FMA contraction outside the dots (``enable_fp_fusion=False``), so every
specialisation of the kernel rounds alike.

Several query heads share a key/value head (grouped-query attention): a program takes BLOCK_M rows of the
``T x GROUPS`` (query position, head of the group) pairs of one key/value head, so K and V are read once
per group rather than copied per head. That a row's bits do not depend on its place in the tile, nor on
the other rows there, is measured on the GPU (``tests/kernels/test_attention.py``), as for the dense GEMM.

Without CUDA the same kernel runs under Triton's interpreter with float32 operands and smaller blocks (the
interpreter's half-precision dots are not faithful; bf16 values are exact in float32).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_CUDA_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
# small blocks under the interpreter, so that small test shapes span several query and key blocks
_INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16}
MAX_HEAD_DIM = 256
DTYPES = (torch.bfloat16, torch.float32)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, BY_SUM: tl.constexpr):
    """``a [M, K] @ b [K, N]`` in float32: ``tl.dot`` at ``PRECISION`` on GPUs; under the interpreter
    (``BY_SUM``) products summed over K, element by element, whose result for a row does not depend on
    its place in the tile (the interpreter's ``tl.dot`` is a NumPy matmul, whose BLAS does)."""
    if BY_SUM:
        return tl.sum(a[:, :, None] * b[None, :, :], 1)
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, key_mask_ptr, key_start_ptr, query_offset_ptr,
    T, S, KV_HEADS, GROUPS, HEAD_DIM,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_t, sm_b,
    qk_scale,
    STATIC_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QK_PRECISION: tl.constexpr,
    PV_PRECISION: tl.constexpr,
    DOT_BY_SUM: tl.constexpr,
):  # fmt: skip
    """``out[b, t, h] = Σ_s softmax_s(q[b, h, t] · k[b, h // GROUPS, s] / sqrt(D)) v[b, h // GROUPS, s]`` over
    the keys ``s`` with ``key_start[b] <= s <= query_offset + t`` and ``key_mask[b, s]``; zeros for a row
    with no such key.

    Program ``(pid_m, b * KV_HEADS + kv_head)`` computes rows ``r`` in ``[pid_m * BLOCK_M, +BLOCK_M)`` of
    the ``T * GROUPS`` pairs ``(t, g) = (r // GROUPS, r % GROUPS)`` (query head ``kv_head * GROUPS + g``).
    ``STATIC_BLOCKS``: 0 on GPUs (the number of key blocks is read at run time); under the interpreter,
    whose loops cannot take a device value as bound, ``cdiv(S, BLOCK_N)`` (blocks past the causal end are
    fully masked, hence no-ops).
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // KV_HEADS).to(tl.int64)
    kv_head = (pid_bh % KV_HEADS).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < T * GROUPS
    rows = tl.where(row_ok, rows, 0)
    t = (rows // GROUPS).to(tl.int64)
    head = kv_head * GROUPS + rows % GROUPS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_offs = b * sq_b + head[:, None] * sq_h + t[:, None] * sq_t + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    query_pos = tl.load(query_offset_ptr) + t  # each row's own key index: the causal bound
    start = tl.load(key_start_ptr + b)
    last_t = (tl.minimum(pid_m * BLOCK_M + BLOCK_M, T * GROUPS) - 1) // GROUPS
    end = tl.minimum(tl.load(query_offset_ptr) + last_t + 1, S)  # past every row's causal bound
    k_base = k_ptr + b * sk_b + kv_head * sk_h
    v_base = v_ptr + b * sv_b + kv_head * sv_h
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    n_blocks = tl.maximum(tl.cdiv(end - start, BLOCK_N), 0)
    # the interpreter's loops need a Python int bound (and turn every assigned value into a tensor)
    for block in tl.range(0, STATIC_BLOCKS if STATIC_BLOCKS > 0 else n_blocks):
        keys = start + block * BLOCK_N + tl.arange(0, BLOCK_N)
        key_ok = keys < end
        real = tl.load(key_mask_ptr + b * sm_b + keys, mask=key_ok, other=0) != 0
        kt = tl.load(k_base + keys[None, :] * sk_s + d[:, None], mask=key_ok[None, :] & d_ok[:, None], other=0.0)
        scores = _dot(q, kt, QK_PRECISION, DOT_BY_SUM) * qk_scale
        attend = (real & key_ok)[None, :] & (keys[None, :] <= query_pos[:, None])
        scores = tl.where(attend, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.where(m_new == m_i, 1.0, tl.exp2(m_i - m_safe))
        p = tl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * sv_s + d[None, :], mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + _dot(p, v.to(tl.float32), PV_PRECISION, DOT_BY_SUM)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_offs = b * so_b + head[:, None] * so_h + t[:, None] * so_t + d[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _check(q, k, v, key_mask, key_start, query_offset) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(
            f"attention needs q [B, H, T, D] and k, v [B, KVH, S, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    (b, h, _, d), (_, kvh, s, _) = q.shape, k.shape
    if k.shape[0] != b or k.shape[3] != d or kvh == 0 or h % kvh:
        raise ValueError(f"k, v {tuple(k.shape)} do not fit q {tuple(q.shape)} (batch, head_dim, heads % kv heads)")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"attention kernel takes head_dim in [1, {MAX_HEAD_DIM}], got {d}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"attention operands must share a dtype in {DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    if key_mask.shape != (b, s) or key_mask.dtype != torch.bool:
        raise ValueError(f"key_mask must be bool [{b}, {s}], got {key_mask.dtype} {tuple(key_mask.shape)}")
    if key_start.shape != (b,) or query_offset.shape != (1,):
        raise ValueError(
            f"key_start must be [{b}] and query_offset [1], got {tuple(key_start.shape)}, {tuple(query_offset.shape)}"
        )
    if len({t.device for t in (q, k, v, key_mask, key_start, query_offset)}) != 1:
        raise ValueError("attention operands, mask and offsets must share a device")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor,
    key_start: torch.Tensor,
    query_offset: torch.Tensor,
) -> torch.Tensor:
    """Causal softmax attention ``softmax(q kᵀ / sqrt(D)) v`` whose every row is independent of the batch.

    Args:
        q: ``[B, H, T, D]`` queries, bfloat16 or float32 (float32 operands under the interpreter either way).
        k, v: ``[B, KVH, S, D]`` keys and values in ``q``'s dtype, ``H`` a multiple of ``KVH`` (query head
            ``h`` reads key/value head ``h // (H // KVH)``). Any strides.
        key_mask: bool ``[B, S]``, True on real keys.
        key_start: int64 ``[B]``, each sequence's first real key: where its key blocks start. Keys before
            it are never attended to.
        query_offset: int64 ``[1]``, the key index of query ``t = 0`` (query ``t`` attends to keys up to
            ``query_offset + t``); a device tensor, so a CUDA graph can advance it.
    Returns:
        ``[B, H, T, D]`` in ``q``'s dtype (a view of a ``[B, T, H, D]`` tensor); a row with no attended key
        (a padding query before its sequence's first real key) is zeros.
    Raises:
        ValueError: shapes, dtypes or devices that do not fit, or a head_dim above 256.
    """
    _check(q, k, v, key_mask, key_start, query_offset)
    (b, h, t, d), (_, kvh, s, _) = q.shape, k.shape
    out = torch.empty((b, t, h, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out.transpose(1, 2)
    cuda = q.is_cuda
    if not cuda:  # the interpreter multiplies in float32 (bf16 -> float32 is exact)
        q, k, v = q.float(), k.float(), v.float()
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    key_mask = key_mask.view(torch.uint8)
    config = _CUDA_CONFIG if cuda else _INTERPRETER_CONFIG
    target = out if cuda else torch.empty(out.shape, dtype=torch.float32)
    grid = (triton.cdiv(t * (h // kvh), config["BLOCK_M"]), b * kvh)
    fp32 = q.dtype == torch.float32
    attention_kernel[grid](
        q, k, v, target, key_mask, key_start, query_offset,
        t, s, kvh, h // kvh, d,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], target.stride(0), target.stride(2), target.stride(1),
        key_mask.stride(0),
        math.log2(math.e) / math.sqrt(d),
        STATIC_BLOCKS=0 if cuda else max(triton.cdiv(s, config["BLOCK_N"]), 1),
        BLOCK_D=max(triton.next_power_of_2(d), 16),
        QK_PRECISION="ieee" if fp32 else "tf32",  # bf16 operands: the tensor cores' bf16 products, exact
        PV_PRECISION="ieee" if fp32 else "tf32x3",
        DOT_BY_SUM=not cuda,
        **config,
        **({"enable_fp_fusion": False} if cuda else {}),
    )  # fmt: skip
    if not cuda:
        out.copy_(target)  # rounded once, to nearest even, as the GPU's store would
    return out.transpose(1, 2)
