"""Optimiser parameter groups of the recipe: no weight decay on quantised weights (docs/design.md §3)."""

from __future__ import annotations

from torch import nn

from nibble.recipe.plan import PrecisionPlan


def param_groups(model: nn.Module, plan: PrecisionPlan, weight_decay: float) -> list[dict]:
    """Split trainable parameters into AdamW groups.

    Quantised weights (NVFP4/MXFP8 in ``plan``) get ``weight_decay=0``: a tiny continuous shrink must
    not hop an FP4 bin. Norm weights and biases get 0 as usual. Everything else gets ``weight_decay``.

    Returns:
        ``[{"params": [...], "weight_decay": wd, "names": [...]}, {"params": [...], "weight_decay": 0.0, ...}]``
        (empty groups omitted; ``names`` is for inspection, AdamW ignores unknown keys).
    Raises:
        ValueError: a negative ``weight_decay``.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay={weight_decay} must be >= 0")
    decayed: dict[str, nn.Parameter] = {}
    exempt: dict[str, nn.Parameter] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        quantised = plan.format_of(name) != "bf16"
        if quantised or param.dim() < 2:
            exempt[name] = param
        else:
            decayed[name] = param
    groups = [
        {"params": list(decayed.values()), "weight_decay": weight_decay, "names": list(decayed)},
        {"params": list(exempt.values()), "weight_decay": 0.0, "names": list(exempt)},
    ]
    return [g for g in groups if g["params"]]
