"""The block-ordered NVFP4 product of docs/design.md §2.6 in plain PyTorch, operation by operation: what
the GPU GEMMs (:mod:`nibble.kernels.gpu.nvfp4_gemm`, :mod:`nibble.kernels.gpu.fragment_gemm`) must equal
bit for bit on every row.

For row ``r`` and column ``n``: each 16-element block ``b`` contributes ``t_b = Σ_i x̃[r, 16b+i] · w̃[n, 16b+i]``
with ``x̃ = e2m1_value · block_scale`` (no global scale), likewise ``w̃``; ``t_b`` is exact in float32 (a
block's products are multiples of one power of two and their sum spans at most 20 bits). Then, in float32
with one rounding per addition: ``chunk_c = (((0 + t_{32c}) + t_{32c+1}) + …)`` over the chunk's (up to) 32
blocks, ``total = ((0 + chunk_0) + chunk_1) + …``, and ``y = (total · gx[r]) · gw``, cast once to the output
dtype. The order depends on K alone: no row count, tile or device changes a row's bits. Memory
``8 · rows · N · K / 16`` bytes: for tests.
"""

from __future__ import annotations

import torch

from ..tensors import NVFP4_BLOCK, NVFP4Tensor

CHUNK_BLOCKS = 32


def _block_values(t: NVFP4Tensor) -> torch.Tensor:
    """float64 ``e2m1_value · block_scale`` of ``t`` (no global scale), ``[..., K / 16, 16]``."""
    values = t.unscaled().dequantize(torch.float64)
    return values.reshape(*t.shape[:-1], t.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)


def ordered_sum(t: torch.Tensor) -> torch.Tensor:
    """Float32 ``[...]``: the block products ``t [B, ...]`` (float32, exact) added in chunks of
    :data:`CHUNK_BLOCKS`, in order."""
    total = torch.zeros(t.shape[1:], dtype=torch.float32, device=t.device)
    for start in range(0, t.shape[0], CHUNK_BLOCKS):
        chunk = torch.zeros_like(total)
        for block in t[start : start + CHUNK_BLOCKS]:
            chunk = chunk + block
        total = total + chunk
    return total


def matmul(qx: NVFP4Tensor, qw: NVFP4Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Activations ``[M, K]`` (global scale ``[M]`` or ``[]``) times a weight ``[N, K]`` (global scale ``[]``)
    -> ``[M, N]`` in ``out_dtype``, block-ordered."""
    t = torch.einsum("mbi,nbi->bmn", _block_values(qx), _block_values(qw)).to(torch.float32)
    gx = qx.global_scale.to(torch.float32)
    gx = gx.reshape(-1, 1) if gx.dim() else gx
    return ((ordered_sum(t) * gx) * qw.global_scale.to(torch.float32)).to(out_dtype)


def grouped_matmul(
    qx: NVFP4Tensor,
    qw: NVFP4Tensor,
    experts: torch.Tensor,
    x_rows: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Row ``r`` is :func:`matmul` of activation row ``x_rows[r]`` (or ``r``) with expert ``experts[r]``'s
    weight of ``qw [E, N, K]`` (one global scale per expert)."""
    x = _block_values(qx)
    gx = qx.global_scale.to(torch.float32)
    if x_rows is not None:
        x, gx = x[x_rows], gx[x_rows]
    t = torch.einsum("rbi,rnbi->brn", x, _block_values(qw)[experts]).to(torch.float32)
    gw = qw.global_scale.to(torch.float32)[experts]
    return ((ordered_sum(t) * gx.reshape(-1, 1)) * gw.reshape(-1, 1)).to(out_dtype)
