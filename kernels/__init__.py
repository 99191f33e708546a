"""Nibble's number formats: NVFP4 and MXFP8 quantisers, their tensor containers and element codecs.

This package imports nothing else of Nibble. ``nibble.kernels.nvfp4`` and ``nibble.kernels.mxfp8``
are the public modules; docs/design.md §2 is the normative definition they implement bit for bit.
"""

from . import gemm, mxfp8, nvfp4
from .tensors import MXFP8Tensor, NVFP4Tensor

__all__ = ["MXFP8Tensor", "NVFP4Tensor", "gemm", "mxfp8", "nvfp4"]
