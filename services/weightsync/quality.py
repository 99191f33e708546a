"""How good the quantise-once form is: relative MSE of each quantised weight against its bf16 cast
(``nibble_quant_rel_error{layer}``) and the fraction of NVFP4 blocks that chose map-to-4
(``nibble_four_over_six_fraction``), measured from the published and the quantised tensors.

The format does not record the 4/6 choice, but it can be read back exactly: a block chose map-to-4
iff its stored scale differs from its map-to-6 candidate ``e4m3(bmax / 6 · S)`` (docs/design.md §2.3: when
the two candidates are equal their errors tie, and ties keep map-to-6). Work goes one expert (or one
slab of rows) at a time, so memory stays near one expert's float32 copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from nibble.kernels import MXFP8Tensor, NVFP4Tensor
from nibble.kernels.nvfp4 import NVFP4_BLOCK, e4m3_rne
from nibble.kernels.reference.nvfp4 import E_FOUR_OVER_SIX, global_encode_scale
from nibble.recipe.export import SEPARATOR
from nibble.recipe.plan import PrecisionPlan

ROWS_PER_SLAB = 4096
"""Rows of a 2-D weight measured at once (bounds the float32 temporaries)."""


@dataclass
class Quality:
    """Per quantised weight: relative MSE; over all NVFP4 blocks: how many chose map-to-4."""

    rel_error: dict[str, float] = field(default_factory=dict)
    map_to_4_blocks: int = 0
    nvfp4_blocks: int = 0

    @property
    def four_over_six_fraction(self) -> float:
        """Fraction of NVFP4 blocks that chose map-to-4 (0 without NVFP4 blocks)."""
        return self.map_to_4_blocks / self.nvfp4_blocks if self.nvfp4_blocks else 0.0


def measure(published: dict[str, torch.Tensor], quantized: dict[str, torch.Tensor], plan: PrecisionPlan) -> Quality:
    """Quality of ``quantized`` (``quantize_state(published, plan)``) against ``published`` (bf16)."""
    quality = Quality()
    for name, weight in published.items():
        fmt = plan.format_of(name)
        if fmt == "bf16":
            continue
        parts = {key.split(SEPARATOR, 1)[1]: t for key, t in quantized.items() if key.startswith(name + SEPARATOR)}
        err = ref = 0.0
        group = plan.scale_group(name)
        outer_amax = max(published[m].abs().amax().float() for m in group) if group else None
        for x, q, amax in _slabs(weight, parts, fmt, plan, outer_amax):
            d = q.dequantize(torch.float32) - x
            err += float(d.double().pow(2).sum())
            ref += float(x.double().pow(2).sum())
            if isinstance(q, NVFP4Tensor):
                quality.nvfp4_blocks += q.block_scales.numel()
                if plan.four_over_six:
                    quality.map_to_4_blocks += int(_map_to_4(x, q.block_scales, amax).sum())
        quality.rel_error[name] = err / ref if ref else 0.0
    return quality


def _slabs(
    weight: torch.Tensor,
    parts: dict[str, torch.Tensor],
    fmt: str,
    plan: PrecisionPlan,
    outer_amax: torch.Tensor | None = None,
) -> Iterator[tuple[torch.Tensor, NVFP4Tensor | MXFP8Tensor, torch.Tensor]]:
    """(float32 slab of the weight, its quantised slab, the amax of its outer scale): one expert of a
    stack ``[E, N, K]`` (one outer scale each), or a slab of rows of a 2-D weight (one for the tensor,
    or ``outer_amax`` when the weight shares its global scale with others)."""
    stacked = weight.dim() == 3
    if stacked:
        bounds = [(e, e + 1) for e in range(weight.shape[0])]
    else:
        bounds = [(r, min(r + ROWS_PER_SLAB, weight.shape[0])) for r in range(0, weight.shape[0], ROWS_PER_SLAB)]
        amax = weight.abs().amax().to(torch.float32) if outer_amax is None else outer_amax
    for start, stop in bounds:
        pick = {key: (t[start] if stacked else t[start:stop]) for key, t in parts.items() if t.dim()}
        x = weight[start].to(torch.float32) if stacked else weight[start:stop].to(torch.float32)
        if fmt == "mxfp8":
            yield x, MXFP8Tensor(pick["elements"], pick["block_scales"], "rceil"), torch.zeros(())
            continue
        if stacked:
            amax = x.abs().amax()
        q = NVFP4Tensor(
            codes=pick["codes"],
            block_scales=pick["block_scales"],
            global_scale=pick.get("global_scale", parts["global_scale"]),
            four_over_six=plan.four_over_six is not None,
            shape=x.shape,
        )
        yield x, q, amax


def _map_to_4(x: torch.Tensor, block_scales: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Blocks of ``x`` whose stored scale is not the map-to-6 candidate (the float32 ops of §2.2)."""
    encode = global_encode_scale(amax, E_FOUR_OVER_SIX)
    bmax = x.reshape(*x.shape[:-1], x.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK).abs().amax(dim=-1)
    sf6 = e4m3_rne(bmax / torch.full_like(bmax, 6.0) * encode)
    return sf6.view(torch.uint8) != block_scales.view(torch.uint8)
