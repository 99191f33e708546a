"""Fused RMSNorm in Triton with the bits of the composition it replaces.

:class:`nibble.model.layers.RMSNorm` in bf16 compute is, op by op on CUDA::

    x64 = x.to(float64)
    normed = (x64 * rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).to(float32)
    y = weight.to(bfloat16) * normed.to(bfloat16)          # a bf16 product: float32, rounded once

nine kernels and three float64 intermediates per call, four calls per decoder layer (input, post-attention,
q and k norms), and the rotary embedding that follows the q and k norms is five more (a product, a
negation, a concatenation, a product, a sum) — at sampler decode a visible share of a step's GPU time.
One program here holds a tile of rows and repeats each operation with the same rounding (the rotation
optionally, per head):

- the squares are exact in float64; for bf16 inputs (what the model feeds it) so is their sum whenever a
  row's magnitudes span less than about 2^((37 - log2 n) / 2) (2¹² at n = 2048), and then the summation
  order, which differs from PyTorch's reduction tree, leaves the sum alone. Past that span, and for float32
  inputs (48-bit squares), the two orders can differ in the sum's last float64 bit, which reaches the bf16
  output about once in 2⁴⁴ elements — the same bound the composition's own row invariance rests on
  (:mod:`nibble.recipe.compute`);
- the mean multiplies by ``fl(1/n)``, as PyTorch's CUDA ``mean`` does (its CPU ``mean`` divides instead);
- ``eps`` and ``fl(1/n)`` arrive as float64 (a Python float would become a float32 kernel argument), and
  ``enable_fp_fusion=False`` keeps ``mean + eps`` from becoming an FMA;
- ``rsqrt`` is float64 ``rsqrt`` (libdevice's on CUDA, the same routine as PyTorch's);
- each rounding to bfloat16 is explicit round-to-nearest-even on the float32 bits, because Triton's
  interpreter (the CPU tests) truncates in its float32 -> bfloat16 casts (and mishandles bf16 subnormals,
  so there bf16 operands go in as float32 and the result comes out as float32, both exact);
- the rotation's products and its sum are rounded to bfloat16 one by one, as PyTorch's bf16 operators do
  (the sum first to float32), and its negation flips the sign of zeros as PyTorch's does.

The GPU test (``tests/kernels/test_rms_norm.py``) compares every bit with the composition on CUDA.
"""

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from ..validation import FLOAT_DTYPES

# a program holds ~2048 elements: several short rows (q/k norms over a head) or a chunk of a long one
_TILE_ELEMENTS = 2048
_MAX_BLOCK_N = 2048
_NUM_WARPS = 4


@triton.jit
def _round_to_bf16(v):
    """float32 ``v`` rounded to the nearest bfloat16, ties to even, returned as float32; NaN kept."""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(v == v, rounded.to(tl.float32, bitcast=True), v)


@triton.jit
def _scaled(x_ptr, w_ptr, offs, k, inv_rms, ok, col_ok):
    """``bf16(bf16(w[k]) * bf16(f32(x[offs] * inv_rms)))`` as float32 (``offs [BLOCK_R, BLOCK_N]``)."""
    v = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float64)
    normed = _round_to_bf16((v * inv_rms[:, None]).to(tl.float32))
    w = _round_to_bf16(tl.load(w_ptr + k, mask=col_ok, other=0.0).to(tl.float32))
    return _round_to_bf16(w[None, :] * normed)


@triton.jit
def rms_norm_kernel(
    x_ptr,
    w_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    ROWS,
    N,
    HEADS,
    inv_n: tl.float64,
    eps: tl.float64,
    ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    N_CHUNKS: tl.constexpr,
):
    """``y[r, :] = bf16(bf16(w) * bf16(f32(x[r, :] * rsqrt(Σ x[r, :]² · inv_n + eps))))`` for contiguous
    ``x [ROWS, N]`` (any float dtype up to float32), ``w [N]``, ``out [ROWS, N]`` bfloat16 (float32 under the
    interpreter); ``N ≤ N_CHUNKS · BLOCK_N``. Two passes over the row: the float64 sum of squares, then the
    scaled and rounded output.

    ``ROPE``: ``out = bf16(bf16(y · c) + bf16(rotate_half(y) · s))`` with ``c``, ``s`` the bf16 casts of row
    ``r // HEADS`` of contiguous ``cos``, ``sin`` ``[ROWS / HEADS, N]`` (``N_CHUNKS == 1``, ``N`` even);
    ``rotate_half(y) = (-y[N/2:], y[:N/2])`` needs each element's partner, computed again from its ``x``."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < ROWS
    rows = tl.where(row_ok, rows, 0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    sum_sq = tl.zeros((BLOCK_R,), dtype=tl.float64)
    for chunk in tl.static_range(N_CHUNKS):
        k = chunk * BLOCK_N + cols
        ok = row_ok[:, None] & (k < N)[None, :]
        v = tl.load(x_ptr + rows[:, None] * N + k[None, :], mask=ok, other=0.0).to(tl.float64)
        sum_sq += tl.sum(v * v, axis=1)
    inv_rms = tl.math.rsqrt(sum_sq * inv_n + eps)
    for chunk in tl.static_range(N_CHUNKS):
        k = chunk * BLOCK_N + cols
        col_ok = k < N
        ok = row_ok[:, None] & col_ok[None, :]
        offs = rows[:, None] * N + k[None, :]
        y = _scaled(x_ptr, w_ptr, offs, k, inv_rms, ok, col_ok)
        if ROPE:
            first_half = k < N // 2
            partner = tl.where(first_half, k + N // 2, k - N // 2)
            partner_offs = rows[:, None] * N + partner[None, :]
            y_partner = _scaled(x_ptr, w_ptr, partner_offs, partner, inv_rms, ok, col_ok)
            # Triton's unary minus is 0 - y, which gives +0 for +0: PyTorch's neg flips the sign of zeros too
            rotated = tl.where(first_half[None, :], y_partner * -1.0, y_partner)
            table = (rows // HEADS)[:, None] * N + k[None, :]
            c = _round_to_bf16(tl.load(cos_ptr + table, mask=ok, other=0.0).to(tl.float32))
            s = _round_to_bf16(tl.load(sin_ptr + table, mask=ok, other=0.0).to(tl.float32))
            y = _round_to_bf16(_round_to_bf16(y * c) + _round_to_bf16(rotated * s))
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=ok)  # bf16-exact: no rounding here


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, rope: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """``bf16(weight) * bf16(x / sqrt(mean(x²) + eps))`` over the last dim, bit for bit the composition
    of :class:`nibble.model.layers.RMSNorm` in bf16 compute on CUDA (module docstring); with ``rope``, also
    the rotary embedding that :class:`nibble.model.layers.Attention` applies to its normed q and k heads
    (``y · cos + rotate_half(y) · sin`` in bf16, each product and the sum rounded, as the composition does).

    Args:
        x: ``[..., n]`` float32, bfloat16 or float16, any strides (made contiguous); with ``rope``
            ``[..., heads, n]`` (one row per head).
        weight: ``[n]`` in one of those dtypes, on ``x``'s device.
        eps: added to the mean square (float64), ≥ 0.
        rope: ``(cos, sin)``, each ``x.shape[:-2] + (n,)`` (one row per position, shared by its heads) in one
            of those dtypes (cast to bf16 as the composition does), or None. Needs n even and ≤ 2048.
    Returns ``[..., n]`` bfloat16. CUDA tensors run compiled; CPU tensors only under ``TRITON_INTERPRET=1``
    (tests).
    Raises:
        ValueError: mismatched shapes, dtypes or devices, a CPU tensor without ``TRITON_INTERPRET=1``, or an
            ``eps`` that is not a finite float ≥ 0.
    """
    if weight.dim() != 1 or x.dim() == 0 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"RMSNorm needs x [..., n] and weight [n], got {tuple(x.shape)} and {tuple(weight.shape)}")
    tables = () if rope is None else tuple(rope)
    for t in (x, weight, *tables):
        if t.dtype not in FLOAT_DTYPES or t.device != x.device:
            raise ValueError(
                f"RMSNorm operands must be in {FLOAT_DTYPES} on one device, got {t.dtype} on {t.device} "
                f"(x: {x.dtype} on {x.device})"
            )
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 <= eps < float("inf"):
        raise ValueError(f"RMSNorm eps must be a finite float >= 0, got {eps!r}")
    _backend.resolve(x.device, "triton")  # CUDA, or the CPU under TRITON_INTERPRET=1; else a ValueError
    n = x.shape[-1]
    if rope is not None:
        table_shape = (*x.shape[:-2], n)
        if len(tables) != 2 or x.dim() < 2 or any(tuple(t.shape) != table_shape for t in tables):
            raise ValueError(
                f"rope needs (cos, sin), each {table_shape} for x [..., heads, n] {tuple(x.shape)}, "
                f"got {[tuple(t.shape) for t in tables]}"
            )
        if n % 2 or n > _MAX_BLOCK_N:
            raise ValueError(f"rope needs an even head size of at most {_MAX_BLOCK_N}, got {n}")
    cuda = x.is_cuda
    # the interpreter gets bf16 subnormals wrong: it is handed float32 (exact) and writes float32
    out = torch.empty(x.shape, dtype=torch.bfloat16 if cuda else torch.float32, device=x.device)
    rows = out.numel() // n if n else 0
    if rows == 0:
        return out.to(torch.bfloat16)
    x, weight, *tables = (
        t.contiguous() if cuda or t.dtype != torch.bfloat16 else t.to(torch.float32).contiguous()
        for t in (x, weight, *tables)
    )
    cos, sin = tables if rope is not None else (x, x)  # unread without ROPE
    block_n = min(triton.next_power_of_2(n), _MAX_BLOCK_N)
    block_r = max(1, _TILE_ELEMENTS // block_n)
    heads = x.shape[-2] if rope is not None else 1
    args = (x, weight, cos, sin, out, rows, n, heads, 1.0 / n, float(eps))
    grid = (triton.cdiv(rows, block_r),)
    meta = {"ROPE": rope is not None, "BLOCK_R": block_r, "BLOCK_N": block_n, "N_CHUNKS": triton.cdiv(n, block_n)}
    if cuda:
        with torch.cuda.device(x.device):  # Triton launches on the current device, not the tensors'
            rms_norm_kernel[grid](*args, **meta, num_warps=_NUM_WARPS, enable_fp_fusion=False)
    else:
        rms_norm_kernel[grid](*args, **meta)
    return out.to(torch.bfloat16)
