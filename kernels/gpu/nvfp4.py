"""Launchers for the Triton NVFP4 quantise/dequantise kernels (same results as the torch reference)."""

from __future__ import annotations

import torch
import triton

from ..reference.nvfp4 import E_FOUR_OVER_SIX, E_STANDARD, global_encode_scale
from ..tensors import NVFP4_BLOCK, NVFP4Tensor
from .nvfp4_quantize import nvfp4_dequantize_kernel, nvfp4_quantize_kernel

# Rows of up to this many 16-element blocks are quantised by one program that also reduces their amax.
_MAX_ROW_BLOCKS = 4096
# (elements per chunk, warps per program) by 4/6 or not: a chunk is what one step keeps in registers
# without spilling (4/6 holds several candidates); one thread holds whole blocks, so a chunk should have
# at least 32 · warps blocks (512 · warps elements). Launch parameters only: results are the same bits for
# any of them (the amax is a max, every block is computed alone). Chosen from the sweep of
# benchmarks/quantize_launch_gpu.py (results in benchmarks/results/h200_quantize_launch.json).
LAUNCH = {False: (1024, 2), True: (1024, 2)}
_DEQUANTIZE_CHUNK_ELEMENTS = 4096
# A row split over programs issues its amax pass's loads together up to this many chunks (registers).
_MAX_UNROLLED_CHUNKS = 8


def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tile(kb: int, chunk_elements: int) -> tuple[int, int]:
    """``(BLOCK_M, CHUNK)``: rows per program and 16-element blocks per chunk."""
    chunk = min(triton.next_power_of_2(kb), chunk_elements // NVFP4_BLOCK)
    block_m = max(1, min(64, chunk_elements // (chunk * NVFP4_BLOCK)))
    return block_m, chunk


def quantize(
    x: torch.Tensor,
    *,
    per_token: bool,
    four_over_six: str | None,
    with_choices: bool = False,
    launch: tuple[int, int] | None = None,
    split: int | None = None,
    operand: bool = False,
) -> tuple[NVFP4Tensor, torch.Tensor | None]:
    """Quantise a validated CUDA (or Triton-interpreted CPU) tensor ``x [..., K]`` to NVFP4.

    Args:
        x: float32/bfloat16/float16 ``[..., K]``, ``K % 16 == 0``, finite (checked by the caller).
        per_token: one outer scale per row (all leading dims) instead of one for the tensor.
        four_over_six: ``None``, ``"mse"`` or ``"mae"``.
        with_choices: also return the bool ``[..., K // 16]`` mask of blocks that chose map-to-4.
        launch: ``(elements per chunk, warps)``, default :data:`LAUNCH` (benchmarks try others).
        split: programs per row where per-token rows are reduced in the kernel (at most its chunks; 1 for
            one program per row group). Default: 1 where the row groups alone fill the GPU's
            multiprocessors (and under the interpreter), else enough to fill them — a decode step's few
            rows would otherwise leave most of the GPU idle while each program walks its rows' chunks.
            Launch parameters only: every choice gives the same bits.
        operand: also write :attr:`NVFP4Tensor.operand`, the codes decoded without the global scale (float16
            on CUDA, float32 under the interpreter, as :func:`nibble.kernels.gpu.gemm` reads them).
    Returns:
        ``(tensor, map_to_4 or None)``, bit-identical to :func:`nibble.kernels.reference.nvfp4.quantize`.
    """
    shape = x.shape
    k = shape[-1]
    kb = k // NVFP4_BLOCK
    rows = x.reshape(-1, k)
    if not rows.is_cuda:
        # The interpreter widens 16-bit subnormals wrongly (2^-130 in bfloat16 loads as 0): widen with torch,
        # which is exact, as the kernel's own load is on a GPU.
        rows = rows.to(torch.float32)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m = rows.shape[0]
    device = x.device
    codes = torch.empty((m, k // 2), dtype=torch.uint8, device=device)
    scale_bytes = torch.empty((m, kb), dtype=torch.uint8, device=device)
    g = torch.empty((m if per_token else 1,), dtype=torch.float32, device=device)
    choice = torch.zeros((m, kb), dtype=torch.uint8, device=device) if with_choices else codes
    operand_dtype = torch.float16 if rows.is_cuda else torch.float32
    decoded = torch.empty((m, k), dtype=operand_dtype, device=device) if operand else g  # g: a pointer never written
    amax_in_kernel = per_token and kb <= _MAX_ROW_BLOCKS
    if amax_in_kernel:
        amax = g  # unused by the kernel
    elif per_token:
        amax = torch.linalg.vector_norm(rows, float("inf"), dim=-1).to(torch.float32)
    elif m == 0:
        amax = torch.zeros((1,), dtype=torch.float32, device=device)
    else:
        amax = torch.linalg.vector_norm(rows, float("inf")).to(torch.float32).reshape(1)
    chunk_elements, num_warps = launch or LAUNCH[bool(four_over_six)]
    block_m, chunk = _tile(kb, chunk_elements)
    row_chunks = triton.cdiv(kb, chunk)
    m_programs = triton.cdiv(m, block_m)
    if split is not None and split < 1:
        raise ValueError(f"quantize: split must be a positive number of programs per row, got {split}")
    if split is None:
        sms = _multiprocessors(device) if rows.is_cuda else 0
        split = triton.cdiv(sms, m_programs) if amax_in_kernel and 0 < m_programs < sms else 1
    num_chunks = triton.cdiv(row_chunks, min(split, row_chunks)) if amax_in_kernel else 1
    if m:
        grid = (m_programs, triton.cdiv(row_chunks, num_chunks))
        nvfp4_quantize_kernel[grid](
            rows,
            amax,
            codes.view(torch.int32),
            scale_bytes,
            g,
            choice,
            decoded,
            m,
            kb,
            rows.stride(0),
            E=E_FOUR_OVER_SIX if four_over_six else E_STANDARD,
            PER_TOKEN=per_token,
            AMAX_IN_KERNEL=amax_in_kernel,
            FOUR_OVER_SIX=bool(four_over_six),
            MSE=four_over_six == "mse",
            WRITE_CHOICE=with_choices,
            WRITE_OPERAND=operand,
            BLOCK_M=block_m,
            CHUNK=chunk,
            NUM_CHUNKS=num_chunks,
            ROW_CHUNKS=row_chunks if amax_in_kernel else 1,
            UNROLL_AMAX=num_chunks < row_chunks <= _MAX_UNROLLED_CHUNKS,
            num_warps=num_warps,
            enable_fp_fusion=False,
        )
    elif not per_token:  # an empty tensor's amax is 0, as for an all-zero one
        s = global_encode_scale(torch.zeros((1,), device=device), E_FOUR_OVER_SIX if four_over_six else E_STANDARD)
        g.copy_(torch.ones_like(s) / s)
    tensor = NVFP4Tensor(
        codes=codes.reshape(*shape[:-1], k // 2),
        block_scales=scale_bytes.view(torch.float8_e4m3fn).reshape(*shape[:-1], kb),
        global_scale=g.reshape(shape[:-1]) if per_token else g.reshape(()),
        four_over_six=bool(four_over_six),
        shape=shape,
        operand=decoded.reshape(shape) if operand else None,
    )
    map_to_4 = choice.bool().reshape(*shape[:-1], kb) if with_choices else None
    return tensor, map_to_4


def dequantize(tensor: NVFP4Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Decode ``tensor`` to ``dtype`` (float32 arithmetic, one final cast), as :meth:`NVFP4Tensor.dequantize`.

    The global scale may be ``[]`` (per tensor) or a per-row ``[M]`` tensor over all leading dims;
    a prefix shape (one per expert of a stack) is broadcast to rows first.
    """
    shape = tensor.shape
    k = shape[-1]
    kb = k // NVFP4_BLOCK
    m = tensor.codes.numel() // max(1, k // 2)
    # The interpreter's float32 -> 16-bit casts do not round to nearest even: cast with torch there.
    direct = tensor.codes.is_cuda or dtype == torch.float32
    out = torch.empty(shape, dtype=dtype if direct else torch.float32, device=tensor.device)
    if m == 0:
        return out.to(dtype)
    g = tensor.global_scale.to(torch.float32)
    per_row = g.dim() > 0
    if per_row:
        lead = shape[:-1]
        g = g.reshape(*g.shape, *([1] * (len(lead) - g.dim()))).expand(lead).reshape(-1).contiguous()
    block_m, chunk = _tile(kb, _DEQUANTIZE_CHUNK_ELEMENTS)
    grid = (triton.cdiv(m, block_m), triton.cdiv(kb, chunk))
    nvfp4_dequantize_kernel[grid](
        tensor.codes.contiguous(),
        tensor.block_scales.contiguous().view(torch.uint8),
        g.reshape(-1),
        out,
        m,
        kb,
        G_PER_ROW=per_row,
        BLOCK_M=block_m,
        CHUNK=chunk,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out if direct else out.to(dtype)
