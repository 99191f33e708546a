"""Nibble's weight-sync form ↔ one NVFP4 weight per linear module under Hugging Face module names.

Nibble keeps routed experts as fused stacks (``P.mlp.experts.gate_up_proj [E, 2I, H]``,
``P.mlp.experts.down_proj [E, H, I]``) and sends a quantised weight ``name`` as ``name::codes``,
``name::block_scales``, ``name::global_scale`` (:mod:`nibble.recipe.export`). Checkpoints for inference
engines hold one weight per ``nn.Linear`` of the Hub's layout (``P.mlp.experts.{e}.gate_proj`` …), so an
expert stack becomes ``E`` gate, ``E`` up and ``E`` down modules. Gate and up of an expert are one tensor
in Nibble with one global scale, which both halves keep (vLLM and SGLang fuse them again and expect equal
scales). Splitting and fusing move bytes only: codes, block scales and global scales are not recomputed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from nibble.kernels.tensors import NVFP4_BLOCK
from nibble.recipe.export import SEPARATOR

FLT_MAX = torch.finfo(torch.float32).max
NVFP4_PARTS = ("codes", "block_scales", "global_scale")
_FUSED_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_PER_EXPERT_MODULE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$")
FUSED_BY_ENGINES = (("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj"))
"""Sibling linears that vLLM and SGLang load as one layer with one global scale (the largest of the
checkpoint's; vLLM ``modelopt.py``, ``process_weights_after_loading``: ``weight_scale_2.max()``)."""


@dataclass(frozen=True)
class ModuleWeight:
    """The NVFP4 weight of one linear module, as both checkpoint layouts store it.

    Attributes:
        codes: uint8 ``[N, K // 2]``; element ``2i`` of a row in the low nibble, ``2i+1`` in the high one.
        block_scales: float8_e4m3fn ``[N, K // 16]``.
        global_scale: float32 ``[]``, the decode scale ``g`` (Transformer Engine's convention,
            docs/design.md §2.2): ``x̂ = e2m1(code) · float(block_scale) · g``.
    """

    codes: torch.Tensor
    block_scales: torch.Tensor
    global_scale: torch.Tensor


def split_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, ModuleWeight], dict[str, torch.Tensor]]:
    """Weight-sync's form → ``(quantised weights by module name, dense tensors by tensor name)``, both
    in the Hub's per-expert layout.

    Raises:
        ValueError: naming the weight, for MXFP8 parts (neither layout holds MXFP8 here), missing NVFP4
            parts, or parts of inconsistent shape.
    """
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    dense: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        base, sep, part = name.partition(SEPARATOR)
        if sep:
            grouped.setdefault(base, {})[part] = tensor
        else:
            dense.update(_split_dense(name, tensor))
    modules: dict[str, ModuleWeight] = {}
    for base, parts in grouped.items():
        modules.update(_split_quantized(base, parts))
    return modules, dense


def fuse_state(modules: dict[str, ModuleWeight], dense: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`split_state`: per-expert modules and tensors stacked into Nibble's fused
    experts, quantised weights as ``name::part``.

    Raises:
        ValueError: naming the modules, for experts numbered with gaps, an expert stack mixing quantised
            and dense experts, or gate and up projections of one expert with different global scales
            (Nibble holds them as one tensor with one scale).
    """
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, object]]] = {}
    for module, weight in modules.items():
        match = _PER_EXPERT_MODULE.match(module)
        if match is None:
            out.update(_parts(f"{module}.weight", weight.codes, weight.block_scales, weight.global_scale))
        else:
            experts.setdefault(match.group(1), {}).setdefault(match.group(3), {})[int(match.group(2))] = weight
    for name, tensor in dense.items():
        match = _PER_EXPERT_MODULE.match(name.removesuffix(".weight")) if name.endswith(".weight") else None
        if match is None:
            out[name] = tensor
        else:
            experts.setdefault(match.group(1), {}).setdefault(match.group(3), {})[int(match.group(2))] = tensor
    for prefix, projections in experts.items():
        out.update(_fuse_experts(prefix, projections))
    return out


def fused_scale_conflicts(modules: dict[str, ModuleWeight]) -> list[str]:
    """Groups of sibling modules (:data:`FUSED_BY_ENGINES`) whose global scales differ: an engine that fuses
    them decodes all but the largest-scaled one with another's scale, so their values come out wrong.

    Nibble's expert stacks never conflict (gate and up share one scale), nor do dense gate and up under
    the plan's ``gate_up_global_scale: shared`` (the default); under ``separate`` they usually do.
    """
    conflicts = []
    for group in FUSED_BY_ENGINES:
        for module in modules:
            parent, _, leaf = module.rpartition(".")
            if leaf != group[0]:
                continue
            members = [f"{parent}.{name}" for name in group if f"{parent}.{name}" in modules]
            scales = {modules[m].global_scale.view(torch.int32).item() for m in members}
            if len(members) > 1 and len(scales) > 1:
                conflicts.append(f"{parent}.{{{','.join(group)}}}")
    return conflicts


def encode_scale(decode: torch.Tensor) -> torch.Tensor:
    """A float32 encode scale ``S`` with ``1 / S == decode`` in float32 (one IEEE division), for each
    element of ``decode`` (float32, any shape).

    Nibble keeps Transformer Engine's decode scale ``g = 1 / S`` and not ``S``; a reciprocal does not
    round-trip in floating point, so the float nearest ``1/g`` is checked and, if needed, its neighbours
    (every ``g`` Nibble computes has such a preimage: the ``S`` it came from). ``g = 2^-128`` (an
    all-zero tensor) gives ``S = FLT_MAX``, TE's saturated value.

    Raises:
        ValueError: a decode scale that is not positive and finite, or has no float32 preimage (it was
            not computed as ``1 / S``).
    """
    if decode.dtype != torch.float32 or not bool(torch.isfinite(decode).all()) or bool((decode <= 0).any()):
        raise ValueError(f"global decode scales must be positive finite float32, got {decode.tolist()}")
    one = torch.ones_like(decode)
    nearest = (1.0 / decode.double()).clamp(max=FLT_MAX).float()
    found = torch.zeros_like(decode, dtype=torch.bool)
    chosen = nearest.clone()
    for steps in (0, 1, -1, 2, -2):
        candidate = nearest
        toward = torch.full_like(nearest, float("inf") if steps > 0 else 0.0)
        for _ in range(abs(steps)):
            candidate = torch.nextafter(candidate, toward)
        hit = ~found & torch.isfinite(candidate) & (one / candidate == decode)
        chosen = torch.where(hit, candidate, chosen)
        found |= hit
    if not bool(found.all()):
        raise ValueError(f"global decode scales {decode[~found].tolist()} are not 1/S for any float32 S")
    return chosen


def decode_scale(encode: torch.Tensor) -> torch.Tensor:
    """``g = 1 / S`` in float32 (one IEEE division), the decode scale Nibble keeps, for float32 ``S``."""
    return torch.ones_like(encode) / encode


def check_module(module: ModuleWeight, where: str) -> None:
    """Check dtypes and the shapes' agreement of one module's parts (``K`` from the codes).

    Raises:
        ValueError: starting with ``where`` (file and tensor), naming the part and the expected form.
    """
    codes, scales, g = module.codes, module.block_scales, module.global_scale
    if codes.dtype != torch.uint8 or codes.dim() != 2 or (2 * codes.shape[1]) % NVFP4_BLOCK:
        raise ValueError(f"{where}: packed codes must be uint8 [N, K/2] with K % 16 == 0, got {_form(codes)}")
    n, k = codes.shape[0], 2 * codes.shape[1]
    if scales.dtype != torch.float8_e4m3fn or tuple(scales.shape) != (n, k // NVFP4_BLOCK):
        raise ValueError(f"{where}: block scales must be float8_e4m3fn [{n}, {k // NVFP4_BLOCK}], got {_form(scales)}")
    if g.dtype != torch.float32 or g.numel() != 1:
        raise ValueError(f"{where}: the global scale must be one float32, got {_form(g)}")


def _form(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"


def _parts(name: str, codes: torch.Tensor, scales: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    values = (codes, scales, g)
    return {f"{name}{SEPARATOR}{part}": v.contiguous() for part, v in zip(NVFP4_PARTS, values, strict=True)}


def _split_dense(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    match = _FUSED_EXPERTS.match(name)
    if match is None:
        return {name: tensor}
    prefix, stack = match.groups()
    out = {}
    for e in range(tensor.shape[0]):
        for proj, rows in _expert_rows(stack, tensor.shape[1]):
            out[f"{prefix}.{e}.{proj}.weight"] = tensor[e, rows].contiguous()
    return out


def _split_quantized(base: str, parts: dict[str, torch.Tensor]) -> dict[str, ModuleWeight]:
    if set(parts) != set(NVFP4_PARTS):
        raise ValueError(
            f"{base}: holds parts {sorted(parts)}; only NVFP4 weights ({', '.join(NVFP4_PARTS)}) export to "
            "these layouts (an MXFP8 plan has no compressed-tensors/ModelOpt NVFP4 form)"
        )
    codes, scales, g = (parts[p] for p in NVFP4_PARTS)
    match = _FUSED_EXPERTS.match(base)
    if match is None:
        if not base.endswith(".weight") or codes.dim() != 2:
            raise ValueError(f"{base}: a quantised linear weight must be '<module>.weight' [N, K/2]")
        module = ModuleWeight(codes, scales, g.reshape(()))
        check_module(module, base)
        return {base.removesuffix(".weight"): module}
    prefix, stack = match.groups()
    if codes.dim() != 3 or g.shape != codes.shape[:1]:
        raise ValueError(f"{base}: an expert stack needs codes [E, N, K/2] and one global scale per expert")
    out = {}
    for e in range(codes.shape[0]):
        for proj, rows in _expert_rows(stack, codes.shape[1]):
            module = ModuleWeight(codes[e, rows].contiguous(), scales[e, rows].contiguous(), g[e].clone())
            check_module(module, f"{base}[{e}]")
            out[f"{prefix}.{e}.{proj}"] = module
    return out


def _expert_rows(stack: str, rows: int) -> list[tuple[str, slice]]:
    if stack == "down_proj":
        return [("down_proj", slice(None))]
    half = rows // 2
    return [("gate_proj", slice(0, half)), ("up_proj", slice(half, rows))]


def _fuse_experts(prefix: str, projections: dict[str, dict[int, object]]) -> dict[str, torch.Tensor]:
    numbers = sorted({e for per in projections.values() for e in per})
    expected = [f"{prefix}.{e}.{p}" for e in range(len(numbers)) for p in ("gate_proj", "up_proj", "down_proj")]
    present = {f"{prefix}.{e}.{p}" for p, per in projections.items() for e in per}
    if numbers != list(range(len(numbers))) or present != set(expected):
        missing = sorted(set(expected) - present)[:8]
        raise ValueError(f"{prefix}: experts {numbers} are not 0..E-1 with gate, up and down each (missing {missing})")
    out = {}
    for stack, projs in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
        items = [[projections[p][e] for p in projs] for e in numbers]
        kinds = {type(item) for row in items for item in row}
        if len(kinds) != 1:
            raise ValueError(f"{prefix}.{stack}: some experts are quantised and some are not")
        if kinds == {ModuleWeight}:
            out.update(_fuse_quantized(f"{prefix}.{stack}", items))
        else:
            out[f"{prefix}.{stack}"] = torch.stack([torch.cat(row) for row in items])
    return out


def _fuse_quantized(name: str, items: list[list[ModuleWeight]]) -> dict[str, torch.Tensor]:
    for e, row in enumerate(items):
        scales = {w.global_scale.view(torch.int32).item() for w in row}
        if len(scales) != 1:
            raise ValueError(
                f"{name}: expert {e}'s gate_proj and up_proj have different global scales "
                f"({[w.global_scale.item() for w in row]}); Nibble holds them as one tensor with one scale"
            )
    codes = torch.stack([torch.cat([w.codes for w in row]) for row in items])
    scales = torch.stack([torch.cat([w.block_scales for w in row]) for row in items])
    g = torch.stack([row[0].global_scale.reshape(()) for row in items])
    return _parts(name, codes, scales, g)
