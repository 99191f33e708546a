"""NVFP4 linear-layer products on packed operands: dense ``x @ W.T`` and grouped (MoE) per-expert GEMMs.

Both operands are NVFP4 (activations quantised per token, weights per tensor or per expert); the product
is ``dequantize(x̂) @ dequantize(Ŵ).T`` with float32 (or wider) accumulation. Products of E2M1 and E4M3
values are exact, so backends differ only in accumulation order. On GPUs the order is the block-ordered
sum of docs/design.md §2.6, which fixes every row's bits whatever the row count, kernel or tile: the Triton
kernel keeps the weights packed and decodes them in registers (docs/design.md §8: on Hopper 4-bit weights
pay off through memory traffic), and weights prepared with :func:`with_fragments` (a sampler's) also run
the CUDA fragment kernel at decode sizes. The reference backend (CPU) decodes and multiplies in float64;
:mod:`nibble.kernels.reference.block_gemm` is the block-ordered sum in plain PyTorch, for tests.
"""

from __future__ import annotations

import dataclasses

import torch

from . import backend as _backend
from .fragments import to_fragments
from .tensors import NVFP4Tensor
from .validation import check_output_dtype

__all__ = ["grouped_matmul", "matmul", "refresh_fragments", "with_fragments"]


def with_fragments(qw: NVFP4Tensor) -> NVFP4Tensor:
    """``qw`` (``[N, K]`` or an expert stack ``[E, N, K]``) carrying its codes and block scales also in the
    tensor-core fragment layout (:mod:`nibble.kernels.fragments`): a sampler's packed form, which the decode-size
    GEMM reads. Costs as much memory again as the codes and scales. On a CPU tensor the fragments are built
    too (for tests); only CUDA products read them.

    Raises:
        ValueError: ``qw`` is not an NVFP4 weight ``[N, K]`` / ``[E, N, K]``.
    """
    if not isinstance(qw, NVFP4Tensor):
        raise ValueError(f"with_fragments: needs an NVFP4 weight [N, K] or [E, N, K], got {type(qw).__name__}")
    if len(qw.shape) not in (2, 3):
        raise ValueError(f"with_fragments: needs an NVFP4 weight [N, K] or [E, N, K], got shape {tuple(qw.shape)}")
    return dataclasses.replace(qw, fragments=to_fragments(qw.codes, qw.block_scales))


def refresh_fragments(qw: NVFP4Tensor) -> None:
    """Rewrite ``qw.fragments`` in place from ``qw``'s codes and block scales (after those were overwritten in
    place, e.g. by a weight update), keeping the fragment tensors' storage (a captured CUDA graph reads it)."""
    if qw.fragments is None:
        return
    fresh = to_fragments(qw.codes, qw.block_scales)
    if fresh.words.shape != qw.fragments.words.shape or fresh.scales.shape != qw.fragments.scales.shape:
        raise ValueError(
            f"refresh_fragments: codes {tuple(qw.codes.shape)} no longer fit the fragment layout "
            f"{tuple(qw.fragments.words.shape)}; build a new one with with_fragments"
        )
    qw.fragments.words.copy_(fresh.words)
    qw.fragments.scales.copy_(fresh.scales)


def matmul(
    qx: NVFP4Tensor, qw: NVFP4Tensor, *, out_dtype: torch.dtype = torch.float32, backend: str | None = None
) -> torch.Tensor:
    """``dequantize(qx) @ dequantize(qw).T``: activations ``[M, K]`` (global scale ``[M]`` or ``[]``) times a
    weight ``[N, K]`` (global scale ``[]``) -> ``[M, N]`` in ``out_dtype``.

    Raises:
        ValueError: operands that do not contract, a weight without a per-tensor scale, a bad
            ``out_dtype`` or a backend that cannot run here.
    """
    _check_pair(qx, qw, expected_weight_dims=2)
    check_output_dtype(out_dtype)
    if qw.global_scale.dim() != 0:
        raise ValueError(
            f"matmul: weight {tuple(qw.shape)} needs a per-tensor global scale, got {tuple(qw.global_scale.shape)}"
        )
    if _backend.resolve(qx.device, backend) == "reference":
        return (qx.dequantize(torch.float64) @ qw.dequantize(torch.float64).T).to(out_dtype)
    from .gpu import gemm as _gpu

    return _gpu.matmul(qx, qw, out_dtype)


def grouped_matmul(
    qx: NVFP4Tensor,
    qw: NVFP4Tensor,
    experts: torch.Tensor,
    x_rows: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype = torch.float32,
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Row ``r`` of the result is ``dequantize(qx)[x_rows[r]] @ dequantize(qw[experts[r]]).T``.

    Args:
        qx: activations ``[T, K]`` quantised per token (global scale ``[T]``).
        qw: expert weight stack ``[E, N, K]``, one global scale per expert (``[E]``).
        experts: int64 ``[R]``, the expert of each output row, sorted ascending.
        x_rows: int64 ``[R]``, the activation row of each output row; ``None`` means row ``r`` (``R == T``).
        out_dtype: dtype of the ``[R, N]`` result.
        validate: check that ``experts`` is sorted and in range (a device-to-host sync; hot paths pass
            ``False`` and sort themselves).
    Raises:
        ValueError: mismatched shapes or scales, unsorted or out-of-range ``experts`` (when ``validate``), or
            a backend that cannot run here.
    """
    _check_pair(qx, qw, expected_weight_dims=3)
    check_output_dtype(out_dtype)
    if qx.global_scale.shape != qx.shape[:1]:
        raise ValueError(f"grouped_matmul: activations need per-token global scales [{qx.shape[0]}]")
    if tuple(qw.global_scale.shape) != (qw.shape[0],):
        raise ValueError(f"grouped_matmul: expert stack {tuple(qw.shape)} needs one global scale per expert")
    if experts.dtype != torch.int64 or experts.dim() != 1:
        raise ValueError(f"grouped_matmul: experts must be int64 [R], got {experts.dtype} {tuple(experts.shape)}")
    if x_rows is None and experts.shape[0] != qx.shape[0]:
        raise ValueError(f"grouped_matmul: {experts.shape[0]} expert rows for {qx.shape[0]} activations; pass x_rows")
    if x_rows is not None and (x_rows.dtype != torch.int64 or tuple(x_rows.shape) != tuple(experts.shape)):
        raise ValueError(
            f"grouped_matmul: x_rows must be int64 [R] like experts [{experts.shape[0]}], "
            f"got {x_rows.dtype} {tuple(x_rows.shape)}"
        )
    if validate and x_rows is not None and x_rows.numel() and _out_of_range(x_rows, qx.shape[0]):
        raise ValueError(f"grouped_matmul: x_rows must index the {qx.shape[0]} activation rows")
    if validate and experts.numel() and _unsorted_or_out_of_range(experts, qw.shape[0]):
        raise ValueError(f"grouped_matmul: experts must be sorted ascending and in [0, {qw.shape[0]})")
    if _backend.resolve(qx.device, backend) == "reference":
        x = qx.dequantize(torch.float64)
        x = x if x_rows is None else x[x_rows]
        w = qw.dequantize(torch.float64)[experts]
        return torch.einsum("rk,rnk->rn", x, w).to(out_dtype)
    from .gpu import gemm as _gpu

    return _gpu.grouped_matmul(qx, qw, experts, x_rows, out_dtype)


def _check_pair(qx: NVFP4Tensor, qw: NVFP4Tensor, *, expected_weight_dims: int) -> None:
    if not isinstance(qx, NVFP4Tensor) or not isinstance(qw, NVFP4Tensor):
        raise ValueError("NVFP4 GEMMs take NVFP4Tensor operands (quantise with nibble.kernels.nvfp4.quantize)")
    if len(qx.shape) != 2:
        raise ValueError(f"activations must be [M, K], got shape {tuple(qx.shape)}")
    if len(qw.shape) != expected_weight_dims or qw.shape[-1] != qx.shape[-1]:
        want = "[N, K]" if expected_weight_dims == 2 else "[E, N, K]"
        raise ValueError(f"weight must be {want} with K={qx.shape[-1]}, got shape {tuple(qw.shape)}")
    if qx.device != qw.device:
        raise ValueError(f"operands on different devices: activations {qx.device}, weight {qw.device}")


def _unsorted_or_out_of_range(experts: torch.Tensor, num_experts: int) -> bool:
    return bool((experts[1:] < experts[:-1]).any()) or _out_of_range(experts, num_experts)


def _out_of_range(index: torch.Tensor, size: int) -> bool:
    return int(index.min()) < 0 or int(index.max()) >= size
