"""Quantisation-error report: relative MSE of each number format on synthetic and real weights.

Relative MSE is ``‖x̂ − x‖² / ‖x‖²``, pooled over all tensors of a source (sums of numerators and of
denominators), so large tensors weigh by their size as they do in a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from nibble.kernels import mxfp8, nvfp4
from nibble.model.safetensors_io import read_safetensors, safetensors_files, safetensors_shapes

# Every format of the report needs K % 32 == 0 (MXFP8's block); smaller-block formats then fit too.
REPORT_BLOCK = mxfp8.MXFP8_BLOCK
MAX_SYNTHETIC_ELEMENTS = 2**28


@dataclass(frozen=True)
class FormatError:
    """One cell of the report: a source under one format."""

    source: str
    format: str
    rel_mse: float
    elements: int
    map_to_4_fraction: float | None  # fraction of NVFP4 blocks that chose map-to-4 (4/6 formats only)
    skipped_tensors: int = 0  # tensors of the source that no format could quantise (1-D, K % 32 != 0, …)


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


class WeightSource:
    """The floating-point matrices of a safetensors file or directory that every format can quantise.

    A tensor qualifies with ≥ 2 dims, at least one element and ``K % 32 == 0``; the others are counted
    in ``skipped``. Opening checks the path at once, so a bad path fails before any work.

    Raises:
        ValueError: (from :func:`nibble.model.safetensors_io.safetensors_files`) for a missing path or a directory
            without safetensors files.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.files = safetensors_files(self.path)
        self.skipped = 0

    def elements(self) -> int:
        """Elements of the qualifying tensors, from the files' headers (nothing is loaded).

        Raises:
            ValueError: naming a file that is not a readable safetensors file.
        """
        shapes = safetensors_shapes(self.path)
        return sum(_numel(shape) for _, shape, dtype in shapes if _qualifies(shape, dtype.startswith(("F", "BF"))))

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        found = False
        for name, tensor in read_safetensors(self.path):
            if not _qualifies(tensor.shape, tensor.is_floating_point()):
                self.skipped += 1
                continue
            found = True
            x = tensor.to(torch.float32)
            if not bool(torch.isfinite(x).all()):
                raise ValueError(f"--weights {self.path}: tensor {name} holds NaN or ±inf (as float32)")
            yield name, x
        if not found:
            raise ValueError(
                f"--weights {self.path}: no floating-point matrix with last dim a multiple of {REPORT_BLOCK}"
            )


def _qualifies(shape, floating: bool) -> bool:
    return floating and len(shape) >= 2 and _numel(shape) > 0 and shape[-1] % REPORT_BLOCK == 0


def _numel(shape) -> int:
    n = 1
    for size in shape:
        n *= int(size)
    return n


def measure(
    source: str,
    tensors: Iterable[tuple[str, torch.Tensor]],
    skipped: int = 0,
    progress: Callable[[int, str], None] | None = None,
) -> list[FormatError]:
    """Pooled relative MSE of every format in :data:`FORMATS` over ``tensors``; ``progress(elements,
    name)`` after each tensor.

    Raises:
        ValueError: when every tensor is zero (relative error undefined).
    """
    err = dict.fromkeys(FORMATS, 0.0)
    map4 = dict.fromkeys(FORMATS, 0)
    blocks = 0
    norm = 0.0
    elements = 0
    for tensor_name, x in tensors:
        norm += float(x.double().pow(2).sum())
        elements += x.numel()
        blocks += x.numel() // nvfp4.NVFP4_BLOCK
        for name, run in FORMATS.items():
            x_hat, map_to_4 = run(x)
            err[name] += float((x_hat.double() - x.double()).pow(2).sum())
            if map_to_4 is not None:
                map4[name] += int(map_to_4.sum())
        if progress:
            progress(x.numel(), source if tensor_name == source else f"{source}: {tensor_name}")
    if norm == 0:
        raise ValueError(f"{source}: every tensor is zero; relative error is undefined")
    return [
        FormatError(
            source=source,
            format=name,
            rel_mse=err[name] / norm,
            elements=elements,
            map_to_4_fraction=map4[name] / blocks if "4o6" in name else None,
            skipped_tensors=skipped,
        )
        for name in FORMATS
    ]


def report(
    rows: int,
    cols: int,
    seed: int,
    weights: Path | None,
    weights_label: str | None = None,
    progress: Callable[[int, str], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> list[FormatError]:
    """All cells: Gaussian and Student-t ``[rows, cols]``, plus the weights at ``weights`` if given.
    ``on_start(elements)`` gets the work's size before it begins, ``progress`` as in :func:`measure`.

    Raises:
        ValueError: ``rows * cols`` above :data:`MAX_SYNTHETIC_ELEMENTS`, or bad weights (see
            :class:`WeightSource`).
    """
    if rows * cols > MAX_SYNTHETIC_ELEMENTS:
        raise ValueError(
            f"--rows {rows} x --cols {cols} = {rows * cols} elements; at most {MAX_SYNTHETIC_ELEMENTS} (1 GiB float32)"
        )
    source = WeightSource(weights) if weights is not None else None
    if on_start:
        on_start(2 * rows * cols + (source.elements() if source is not None else 0))
    results = measure("gaussian", gaussian(rows, cols, seed), progress=progress)
    results += measure("student_t3", student_t(rows, cols, seed), progress=progress)
    if source is not None:
        label = weights_label or f"weights:{source.path.name}"
        cells = measure(label, source, progress=progress)
        results += [replace(c, skipped_tensors=source.skipped) for c in cells]
    return results


def as_json(results: list[FormatError]) -> list[dict]:
    return [asdict(r) for r in results]
