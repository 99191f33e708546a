"""Which implementation runs a format operation: the GPU kernels on CUDA (``"triton"``: Triton kernels, and
for NVFP4 products the CUDA fragment GEMMs where they compile), the torch reference elsewhere.

Quantisation returns identical bits on every backend (docs/design.md §2), so there the choice is about speed
only; NVFP4 products are block-ordered on GPUs (§2.6) and accumulated in float64 by the reference, each
batch-shape independent. ``TRITON_INTERPRET=1`` lets the Triton kernels run on CPU tensors (slowly) for
testing.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .validation import check_choice

BACKENDS = ("reference", "triton")


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported here."""
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve(device: torch.device, backend: str | None) -> str:
    """The backend to use for tensors on ``device``: ``backend`` if given, else ``"triton"`` on CUDA when
    Triton is installed and ``"reference"`` otherwise.

    Raises:
        ValueError: an unknown backend, or ``"triton"`` where it cannot run (package missing, or a CPU
            tensor without ``TRITON_INTERPRET=1``).
    """
    if backend is None:
        return "triton" if device.type == "cuda" and triton_available() else "reference"
    check_choice("backend", backend, BACKENDS)
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package (pip install triton); use 'reference'")
        if device.type != "cuda" and not _interpreting():
            raise ValueError(
                f"backend='triton' runs on CUDA tensors, got a tensor on {device} "
                "(set TRITON_INTERPRET=1 to interpret the kernels on the CPU, or use backend='reference')"
            )
    return backend
