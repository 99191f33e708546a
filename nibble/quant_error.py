"""Quantisation-error report: relative MSE of each number format on synthetic and real weights.

Relative MSE is ``‖x̂ − x‖² / ‖x‖²``, pooled over all tensors of a source (sums of numerators and of
denominators), so large tensors weigh by their size as they do in a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nibble.kernels import mxfp8, nvfp4
from nibble.weights import read_safetensors

# Every format of the report needs K % 32 == 0 (MXFP8's block); smaller-block formats then fit too.
REPORT_BLOCK = mxfp8.MXFP8_BLOCK


@dataclass(frozen=True)
class FormatError:
    """One cell of the report: a source under one format."""

    source: str
    format: str
    rel_mse: float
    elements: int
    map_to_4_fraction: float | None  # fraction of NVFP4 blocks that chose map-to-4 (4/6 formats only)


def _nvfp4(scale: str, four_over_six: str | None) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, map_to_4 = nvfp4.quantize_with_choices(x, scale=scale, four_over_six=four_over_six)
        return q.dequantize(), map_to_4

    return run


def _mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, None]:
    return mxfp8.quantize(x, scale_mode="rceil").dequantize(), None


FORMATS: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]] = {
    "nvfp4_per_tensor": _nvfp4("per_tensor", None),
    "nvfp4_per_token": _nvfp4("per_token", None),
    "nvfp4_4o6_mse": _nvfp4("per_tensor", "mse"),
    "nvfp4_4o6_mae": _nvfp4("per_tensor", "mae"),
    "mxfp8_rceil": _mxfp8,
}


def gaussian(rows: int, cols: int, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """One float32 ``[rows, cols]`` standard-normal tensor."""
    gen = torch.Generator().manual_seed(seed)
    yield "gaussian", torch.randn(rows, cols, generator=gen)


def student_t(rows: int, cols: int, seed: int, dof: int = 3) -> Iterator[tuple[str, torch.Tensor]]:
    """One float32 ``[rows, cols]`` Student-t tensor (heavy tails: a few large outliers per block row)."""
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(rows, cols, generator=gen)
    # Chi-squared with integer dof as a sum of squared normals, so ``gen`` alone seeds the draw.
    chi2 = sum(torch.randn(rows, cols, generator=gen) ** 2 for _ in range(dof))
    yield f"student_t{dof}", normal / torch.sqrt(chi2 / dof)


def weight_matrices(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Floating-point tensors of a safetensors file or directory with ≥ 2 dims and ``K % 32 == 0``.

    Raises:
        ValueError: (from :func:`nibble.weights.read_safetensors`) for a missing path, a directory
            without safetensors files or an unreadable file; and when no tensor qualifies.
    """
    found = False
    for name, tensor in read_safetensors(path):
        if tensor.dim() >= 2 and tensor.is_floating_point() and tensor.shape[-1] % REPORT_BLOCK == 0:
            found = True
            yield name, tensor.to(torch.float32)
    if not found:
        raise ValueError(f"--weights {path}: no floating-point matrix with last dim a multiple of {REPORT_BLOCK}")


def measure(source: str, tensors: Iterator[tuple[str, torch.Tensor]]) -> list[FormatError]:
    """Pooled relative MSE of every format in :data:`FORMATS` over ``tensors``."""
    err = dict.fromkeys(FORMATS, 0.0)
    map4 = dict.fromkeys(FORMATS, 0)
    blocks = 0
    norm = 0.0
    elements = 0
    for _, x in tensors:
        norm += float(x.double().pow(2).sum())
        elements += x.numel()
        blocks += x.numel() // nvfp4.NVFP4_BLOCK
        for name, run in FORMATS.items():
            x_hat, map_to_4 = run(x)
            err[name] += float((x_hat.double() - x.double()).pow(2).sum())
            if map_to_4 is not None:
                map4[name] += int(map_to_4.sum())
    return [
        FormatError(
            source=source,
            format=name,
            rel_mse=err[name] / norm if norm else 0.0,
            elements=elements,
            map_to_4_fraction=map4[name] / blocks if "4o6" in name and blocks else None,
        )
        for name in FORMATS
    ]


def report(
    rows: int, cols: int, seed: int, weights: Path | None, weights_label: str | None = None
) -> list[FormatError]:
    """All cells: Gaussian and Student-t ``[rows, cols]``, plus the weights at ``weights`` if given."""
    results = measure("gaussian", gaussian(rows, cols, seed))
    results += measure("student_t3", student_t(rows, cols, seed))
    if weights is not None:
        results += measure(weights_label or f"weights:{weights.name}", weight_matrices(weights))
    return results


def as_json(results: list[FormatError]) -> list[dict]:
    return [asdict(r) for r in results]
