"""The quantised tensor containers: what a quantiser returns and what crosses into GEMMs and the wire."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .codecs import e2m1_decode, unpack_e2m1
from .fragments import NVFP4Fragments
from .validation import check_output_dtype

NVFP4_BLOCK = 16
# The NVFP4 numerics a stored or streamed quantised payload follows; bump when docs/design.md §2.2-2.3 change a
# bit. 1: Nibble's own operation order (until 2026-11-30); 2: Transformer Engine 2.20.2's convention.
NVFP4_FORMAT_VERSION = 2
MXFP8_BLOCK = 32


@dataclass(frozen=True)
class NVFP4Tensor:
    """A tensor in NVFP4: packed E2M1 codes, E4M3 block scales per 16 elements, float32 global scale.

    Attributes:
        codes: uint8 ``[..., K // 2]``; element ``2i`` of a row in the low nibble, ``2i+1`` in the high.
        block_scales: float8_e4m3fn ``[..., K // 16]``.
        global_scale: float32 decode scale ``g = amax / (6 E)``; its shape is a prefix of ``shape[:-1]``:
            ``[]`` for a per-tensor scale, ``shape[:-1]`` for per-token scales, ``[E]`` for a stack of
            per-tensor-scaled expert weights ``[E, N, K]``.
        four_over_six: whether 4/6 chose the block scales (then ``E = 256``); decoding ignores it.
        shape: the logical shape ``[..., K]`` of the quantised tensor.
        fragments: the same codes and block scales in the tensor-core fragment layout
            (:mod:`nibble.kernels.fragments`), kept beside them by a sampler's packed weights for the
            decode-size GEMM; ``None`` elsewhere. Whoever changes ``codes`` or ``block_scales`` in place
            refreshes it (:func:`nibble.kernels.gemm.refresh_fragments`).
        operand: the codes decoded without the global scale, ``e2m1_value(code) * float(block_scale)``,
            ``[..., K]`` in float16 on CUDA (exact) and float32 under the Triton interpreter: the activation
            operand the GPU GEMMs read, written by the quantise kernel beside the codes when asked
            (:func:`nibble.kernels.nvfp4.quantize`'s ``gemm_operand``) so that a GEMM skips its own decode
            launch; ``None`` elsewhere.

    Decode (docs/design.md §2.2 step 5): ``x̂ = e2m1_value(code) * float(block_scale) * global_scale``.
    """

    codes: torch.Tensor
    block_scales: torch.Tensor
    global_scale: torch.Tensor
    four_over_six: bool
    shape: torch.Size
    fragments: NVFP4Fragments | None = None
    operand: torch.Tensor | None = None

    def unscaled(self) -> NVFP4Tensor:
        """The same codes and block scales with unit global scales (of the same shape): what the GEMMs
        multiply before applying the global scales (docs/design.md §2.6); without the fragment layout."""
        ones = torch.ones_like(self.global_scale, dtype=torch.float32)
        return NVFP4Tensor(self.codes, self.block_scales, ones, self.four_over_six, self.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Decode to a dense tensor of ``self.shape`` in ``dtype`` (computed in float32, cast once).

        Raises:
            ValueError: ``dtype`` is not a floating-point ``torch.dtype``.
        """
        check_output_dtype(dtype)
        values = e2m1_decode(unpack_e2m1(self.codes))
        k = self.shape[-1]
        blocks = values.reshape(*self.shape[:-1], k // NVFP4_BLOCK, NVFP4_BLOCK)
        scaled = blocks * self.block_scales.to(torch.float32).unsqueeze(-1)
        g = self.global_scale.reshape(*self.global_scale.shape, *([1] * (blocks.dim() - self.global_scale.dim())))
        return (scaled * g).reshape(self.shape).to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held by codes, block scales and global scale together (not the fragment copy)."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.block_scales, self.global_scale))

    @property
    def device(self) -> torch.device:
        return self.codes.device


@dataclass(frozen=True)
class MXFP8Tensor:
    """A tensor in MXFP8 (OCP MX v1.0): E4M3 elements with a power-of-two E8M0 scale per 32 elements.

    Attributes:
        elements: float8_e4m3fn ``[..., K]``.
        block_scales: float8_e8m0fnu ``[..., K // 32]``; the byte is the biased exponent ``e + 127``.
        scale_mode: ``"rceil"`` or ``"floor"``, how the exponents were chosen (informational).

    Decode: ``x̂ = float(element) * 2^e``.
    """

    elements: torch.Tensor
    block_scales: torch.Tensor
    scale_mode: str

    @property
    def shape(self) -> torch.Size:
        return self.elements.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Decode to a dense tensor of ``self.shape`` in ``dtype`` (float32 arithmetic, one final cast).

        Raises:
            ValueError: ``dtype`` is not a floating-point ``torch.dtype``.
        """
        check_output_dtype(dtype)
        k = self.shape[-1]
        blocks = self.elements.to(torch.float32).reshape(*self.shape[:-1], k // MXFP8_BLOCK, MXFP8_BLOCK)
        scales = self.block_scales.to(torch.float32).unsqueeze(-1)
        return (blocks * scales).reshape(self.shape).to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held by elements and block scales together."""
        return sum(t.numel() * t.element_size() for t in (self.elements, self.block_scales))
