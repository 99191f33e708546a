"""What crosses from trainer to sampler: the bf16 state the trainer publishes, the quantised form
weight-sync derives from it once, and applying that form to a sampler's packed model.

Names are the model's own parameter names (experts as fused stacks). A quantised weight ``name``
travels as ``name::codes``, ``name::block_scales`` and ``name::global_scale`` (NVFP4) or
``name::elements`` and ``name::block_scales`` (MXFP8); everything else as one bf16 tensor.
"""

from __future__ import annotations

import torch
from torch import nn

from nibble.kernels import NVFP4Tensor
from nibble.recipe.modules import PlannedExperts, PlannedLinear
from nibble.recipe.plan import PrecisionPlan
from nibble.recipe.quant import quantize_weight, quantize_weights_together, refresh_sampler_form

SEPARATOR = "::"
_NVFP4_PARTS = ("codes", "block_scales", "global_scale")
_MXFP8_PARTS = ("elements", "block_scales")


def published_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainer's publication: every parameter's bf16 cast (CPU, contiguous), by parameter name."""
    return {name: p.detach().to(torch.bfloat16).cpu().contiguous() for name, p in model.named_parameters()}


def quantize_state(state: dict[str, torch.Tensor], plan: PrecisionPlan) -> dict[str, torch.Tensor]:
    """Weight-sync's form of a published bf16 ``state``: quantised parts for the plan's NVFP4/MXFP8
    weights (quantised from exactly these bf16 bytes), the other tensors unchanged.

    Raises:
        ValueError: a tensor that is not bf16, or a quantised weight of unexpected rank.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if tensor.dtype != torch.bfloat16:
            raise ValueError(f"{name}: published weights must be bfloat16, got {tensor.dtype}")
        fmt = plan.format_of(name)
        if fmt == "bf16":
            out[name] = tensor
            continue
        if tensor.dim() not in (2, 3):
            raise ValueError(f"{name}: a quantised weight must be [N, K] or [E, N, K], got {tuple(tensor.shape)}")
        q = _quantize_in_group(name, state, plan) if plan.scale_group(name) else quantize_weight(tensor, fmt, plan)
        parts = _NVFP4_PARTS if isinstance(q, NVFP4Tensor) else _MXFP8_PARTS
        for part in parts:
            out[f"{name}{SEPARATOR}{part}"] = getattr(q, part).contiguous()
    return out


def _quantize_in_group(name: str, state: dict[str, torch.Tensor], plan: PrecisionPlan) -> NVFP4Tensor:
    """``name``'s quantisation with the one global scale of its group (:meth:`PrecisionPlan.scale_group`),
    as the model computes it (:class:`nibble.model.layers.MLP`)."""
    group = plan.scale_group(name)
    missing = [member for member in group if member not in state]
    if missing:
        raise ValueError(f"{name}: shares its global scale with {missing}, which the state lacks")
    try:
        together = quantize_weights_together([state[member] for member in group], plan)
    except ValueError as error:
        raise ValueError(f"{' and '.join(group)}: {error}") from None
    return together[group.index(name)]


def load_sampler_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy weight-sync's form into a packed (sampler-form) model, in place.

    Raises:
        ValueError: listing missing or unexpected tensors, or naming one whose shape/dtype differs.
    """
    expected = _expected(model)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"weights: missing {missing[:8]}; unexpected {unexpected[:8]}")
    for name, target in expected.items():
        tensor = state[name]
        if tensor.shape != target.shape or tensor.dtype != target.dtype:
            raise ValueError(
                f"weights: {name} is {tensor.dtype} {tuple(tensor.shape)}, "
                f"model holds {target.dtype} {tuple(target.shape)}"
            )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(state[name])
        for _, _, packed in _packed_modules(model):
            for q in packed:
                refresh_sampler_form(q)


def _packed_modules(model: nn.Module):
    """``(module name, weight names, quantised weights)`` of every packed quantised layer of ``model``."""
    for module_name, module in model.named_modules():
        if not isinstance(module, (PlannedLinear, PlannedExperts)) or module.packed is None:
            continue
        packed = module.packed if isinstance(module, PlannedExperts) else (module.packed,)
        names = ("gate_up_proj", "down_proj") if isinstance(module, PlannedExperts) else ("weight",)
        yield module_name, names, packed


def _expected(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a sampler-form model holds (the copy destinations), by wire name."""
    out = {name: param.data for name, param in model.named_parameters()}
    for module_name, names, packed in _packed_modules(model):
        for weight_name, q in zip(names, packed, strict=True):
            parts = _NVFP4_PARTS if isinstance(q, NVFP4Tensor) else _MXFP8_PARTS
            for part in parts:
                out[f"{module_name}.{weight_name}{SEPARATOR}{part}"] = getattr(q, part)
    return out
