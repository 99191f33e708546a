"""NVFP4 linear-layer products on packed operands: dense ``x @ W.T`` and grouped (MoE) per-expert GEMMs.

Both operands are NVFP4 (activations quantised per token, weights per tensor or per expert); the product
is ``dequantize(x̂) @ dequantize(Ŵ).T`` with float32 (or wider) accumulation. Products of E2M1 and E4M3
values are exact, so backends differ only in accumulation order. The Triton backend keeps the weights
packed and decodes them in registers (docs/design.md §8: on Hopper 4-bit weights pay off through memory
traffic); the reference backend decodes and multiplies in float64.
"""

from __future__ import annotations

import torch

from . import backend as _backend
from .tensors import NVFP4Tensor
from .validation import check_output_dtype

__all__ = ["grouped_matmul", "matmul"]


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
    return bool((experts[1:] < experts[:-1]).any()) or int(experts.min()) < 0 or int(experts.max()) >= num_experts
