"""Nibble's number formats: NVFP4 and MXFP8 quantisers, their tensor containers and element codecs.

This package imports nothing else of Nibble. ``nibble.kernels.nvfp4`` and ``nibble.kernels.mxfp8``
are the public modules; docs/design.md §2 is the normative definition they implement bit for bit.

Its folder, ``kernels/`` at the repository root (docs/design.md §1), is also importable as a top-level
``kernels`` whenever the root is on ``sys.path`` (``python -m`` or pytest run from it). That name belongs
to Hugging Face's ``kernels`` distribution, which transformers (5.25 on) and SGLang import, so imported
under it this file hands the name over (:mod:`._top_level`) instead of shadowing the distribution.
"""

if __name__ == "kernels":
    from ._top_level import hand_over

    hand_over()
else:
    from . import gemm, mxfp8, nvfp4
    from .tensors import MXFP8Tensor, NVFP4Tensor

    __all__ = ["MXFP8Tensor", "NVFP4Tensor", "gemm", "mxfp8", "nvfp4"]
