"""NVFP4 checkpoint directories in the compressed-tensors or ModelOpt layout: export and import.

A directory holds ``model.safetensors`` (quantised modules in the layout's names, every other tensor as
Nibble holds it: bf16), ``config.json`` (the model's Hugging Face config plus the layout's
``quantization_config``), the layout's own config file if it has one, ``nibble_plan.json`` (the
precision plan, so Nibble reads back exactly what it wrote; engines ignore it) and the tokenizer files
of the source when given. Export and import move bytes only: a round trip gives back Nibble's codes,
block scales, global decode scales and unquantised tensors bit for bit.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors.torch import save_file

from nibble.interop.base import Layout
from nibble.interop.compressed_tensors import COMPRESSED_TENSORS
from nibble.interop.layout import ModuleWeight, check_module, fuse_state, fused_scale_conflicts, split_state
from nibble.interop.modelopt import MODELOPT
from nibble.model.checkpoint_dir import check_output, write_directory
from nibble.model.safetensors_io import read_safetensors, safetensors_files
from nibble.recipe.plan import PrecisionPlan

log = logging.getLogger(__name__)

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (COMPRESSED_TENSORS, MODELOPT)}
"""The layouts by name, as ``--format`` and ``weightsync.export_format`` spell them."""

PLAN_FILE, WEIGHTS_FILE, CONFIG_FILE = "nibble_plan.json", "model.safetensors", "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class QuantizedCheckpoint:
    """A quantised model as Nibble holds it.

    Attributes:
        state: weight-sync's form (:func:`nibble.recipe.export.quantize_state`): Nibble parameter names,
            fused expert stacks, NVFP4 weights as ``name::codes`` uint8 ``[..., N, K/2]``,
            ``name::block_scales`` float8_e4m3fn ``[..., N, K/16]``, ``name::global_scale`` float32 decode
            scale (``[]``, or ``[E]`` for an expert stack), everything else bf16.
        model_config: ``config.json``'s keys without ``quantization_config`` (``None``: not known).
        plan: the precision plan (``None`` for a directory another tool wrote).
    """

    state: dict[str, torch.Tensor]
    model_config: dict | None = None
    plan: PrecisionPlan | None = None


def version_dir(root: Path, version: int) -> Path:
    """Where weight-sync's ``export_format`` writes ``version`` under ``root`` (``export_dir``) and where an
    engine that loads versions from disk (``sampler.engine: sglang``) finds it: ``v<version, 20 digits>``,
    so names sort as versions do."""
    return Path(root) / f"v{version:020d}"


def from_model_dir(path: Path, plan: PrecisionPlan) -> QuantizedCheckpoint:
    """Quantise a Nibble (Hugging Face format) model directory under ``plan`` exactly as weight-sync
    quantises a publication: the trainer's bf16 casts, then :func:`~nibble.recipe.export.quantize_state`.

    Raises:
        ValueError: from reading the directory (naming the file), or a plan for another layer count.
    """
    from nibble.model import from_pretrained
    from nibble.recipe.export import published_state, quantize_state

    path = Path(path)
    model = from_pretrained(path, plan=plan)
    config = _read_json(path / CONFIG_FILE)
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"  # the unquantised tensors are written as the trainer publishes them
    return QuantizedCheckpoint(quantize_state(published_state(model), plan), config, plan)


def export_checkpoint(
    checkpoint: QuantizedCheckpoint,
    out: Path,
    layout: str,
    *,
    tokenizer_from: Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``checkpoint`` to directory ``out`` in ``layout`` (``compressed-tensors`` writes the ENCODE
    scale ``weight_global_scale``, ``modelopt`` the DECODE scale ``weight_scale_2``). The directory
    appears complete or not at all.

    Raises:
        ValueError: an unknown layout, a non-empty ``out`` without ``overwrite`` (or ``out`` holding
            ``tokenizer_from``, the source), or a weight that has
            no NVFP4 form in these layouts (MXFP8), naming it.
    """
    chosen = _layout(layout)
    out = Path(out)
    check_output(out, overwrite=overwrite, source=tokenizer_from)
    modules, dense = split_state(checkpoint.state)
    conflicts = fused_scale_conflicts(modules)
    if conflicts:
        log.warning(
            "%d groups of projections that engines fuse have different global scales (e.g. %s); vLLM and SGLang "
            "would decode them with one scale, wrongly: quantise with the plan's gate_up_global_scale: shared "
            "(README, 'NVFP4 checkpoints for SGLang and vLLM')",
            len(conflicts),
            conflicts[0],
        )
    tensors = {k: v.contiguous() for k, v in dense.items()}
    for module, weight in modules.items():
        tensors[f"{module}.{chosen.packed}"] = weight.codes
        tensors[f"{module}.{chosen.block}"] = weight.block_scales
        tensors[f"{module}.{chosen.global_}"] = chosen.global_to_file(weight.global_scale)
    files = chosen.config_files(_unquantized_linears(dense), checkpoint.plan)
    config = {**(checkpoint.model_config or {}), "quantization_config": files.pop("quantization_config")}
    files[CONFIG_FILE] = config
    if checkpoint.plan is not None:
        files[PLAN_FILE] = checkpoint.plan.model_dump(mode="json")

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        for name, content in files.items():
            (tmp / name).write_text(json.dumps(content, indent=2) + "\n")

    _write_directory(out, fill, tokenizer_from)
    return out


def import_checkpoint(path: Path) -> QuantizedCheckpoint:
    """Read a compressed-tensors or ModelOpt NVFP4 directory (which one, from ``config.json``'s
    ``quantization_config``) into Nibble's form; the global scale becomes a decode scale.

    Raises:
        ValueError: naming the file and the tensor, for a directory of another format, a config of
            another scheme, a packed weight without its block or global scale (or scales without a
            packed weight), or parts of the wrong dtype or shape.
    """
    path = Path(path)
    config = _read_json(path / CONFIG_FILE)
    quantization = config.pop("quantization_config", None)
    layout = _detect(quantization, path / CONFIG_FILE)
    layout.check_config(quantization, str(path / CONFIG_FILE))
    tensors, files = _read_tensors(path)
    modules = _modules(layout, tensors, files)
    taken = {f"{m}.{suffix}" for m in modules for suffix in (layout.packed, layout.block, layout.global_)}
    dropped = {f"{m}.{suffix}" for m in modules for suffix in layout.ignored}
    dense = {name: t for name, t in tensors.items() if name not in taken and name not in dropped}
    _check_orphans(layout, dense, files)
    plan_file = path / PLAN_FILE
    plan = _read_plan(plan_file, modules, dense, config) if plan_file.exists() else None
    checkpoint = QuantizedCheckpoint(fuse_state(modules, dense), config, plan)
    _check_shapes(checkpoint, path / CONFIG_FILE)
    return checkpoint


def _read_plan(
    plan_file: Path, modules: dict[str, ModuleWeight], dense: dict[str, torch.Tensor], config: dict
) -> PrecisionPlan:
    """The export's plan, checked against its tensors: its layer count is the model's, exactly the weights
    it puts in NVFP4 are packed, and a plan whose gate and up share one global scale comes with tensors
    that do. Plans written before ``gate_up_global_scale`` existed quantised every projection on its own
    scale, so a missing field reads as ``separate``."""
    if not plan_file.is_file():
        raise ValueError(f"{plan_file}: not a file")
    values = _read_json(plan_file)
    if isinstance(values, dict):
        values.setdefault("gate_up_global_scale", "separate")
    try:
        plan = PrecisionPlan.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'plan'}: {e['msg']}" for e in error.errors())
        raise ValueError(f"{plan_file}: not a precision plan: {problems}") from None
    layers = config.get("num_hidden_layers")
    if layers != plan.num_layers:
        raise ValueError(f"{plan_file}: num_layers={plan.num_layers}, but config.json has num_hidden_layers={layers}")
    try:
        for module in modules:
            if plan.format_of(f"{module}.weight") != "nvfp4":
                raise ValueError(f"{module} is stored in NVFP4, but the plan gives it another format")
        for name in dense:
            if plan.format_of(name) == "nvfp4":
                raise ValueError(f"the plan puts {name} in NVFP4, but it is stored unquantised")
    except ValueError as exc:  # format_of also names a tensor of a layer the plan does not have
        raise ValueError(f"{plan_file}: {exc}") from None
    conflicts = fused_scale_conflicts(modules)
    if plan.gate_up_global_scale == "shared" and conflicts:
        raise ValueError(
            f"{plan_file}: gate_up_global_scale is 'shared' but {conflicts[0]} "
            f"(and {len(conflicts) - 1} more) have different global scales"
        )
    return plan


def _check_shapes(checkpoint: QuantizedCheckpoint, config_file: Path) -> None:
    """Refuse tensors that the model ``config.json`` describes could not load (missing, unexpected, or of
    another shape), as :func:`nibble.model.from_pretrained` would later: checked on shapes alone (meta
    tensors), so nothing is decoded or allocated."""
    from nibble.model import ModelConfig
    from nibble.model.hf import model_from_state

    meta = QuantizedCheckpoint({k: v.to("meta") for k, v in checkpoint.state.items()}, checkpoint.model_config)
    try:
        config = ModelConfig.from_hf(checkpoint.model_config)
    except ValueError as exc:
        raise ValueError(f"{config_file}: {exc}") from None
    with torch.device("meta"):
        model_from_state(config, dequantized_state(meta), where=str(config_file))


def dequantized_state(checkpoint: QuantizedCheckpoint, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The checkpoint as dense tensors in the Hub's per-expert layout (what ``nibble.model.from_pretrained``
    reads): each NVFP4 weight decoded as Nibble decodes it (float32 arithmetic, one cast to ``dtype``)."""
    from nibble.kernels import NVFP4Tensor

    modules, dense = split_state(checkpoint.state)
    out = {name: tensor.to(dtype) for name, tensor in dense.items()}
    for module, w in modules.items():
        shape = torch.Size((w.codes.shape[0], 2 * w.codes.shape[1]))
        q = NVFP4Tensor(w.codes, w.block_scales, w.global_scale, False, shape)
        out[f"{module}.weight"] = q.dequantize(dtype)
    return out


def write_dequantized(
    checkpoint: QuantizedCheckpoint,
    out: Path,
    *,
    dtype: torch.dtype = torch.float32,
    tokenizer_from: Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``checkpoint`` as a Nibble (plain Hugging Face) checkpoint: ``config.json`` without
    ``quantization_config``, dense ``model.safetensors`` (:func:`dequantized_state`), the plan and the
    tokenizer files. Float32 holds Nibble's decoded values exactly; quantising them again need not give
    the same codes (their amax differs from the original's).

    Raises:
        ValueError: no model config, a non-empty ``out`` without ``overwrite``, or ``out`` holding
            ``tokenizer_from`` (the source).
    """
    if checkpoint.model_config is None:
        raise ValueError("the checkpoint has no model config (config.json) to write")
    out = Path(out)
    check_output(out, overwrite=overwrite, source=tokenizer_from)
    tensors = {k: v.contiguous() for k, v in dequantized_state(checkpoint, dtype).items()}
    config = {**checkpoint.model_config, "torch_dtype": str(dtype).removeprefix("torch.")}

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        if checkpoint.plan is not None:
            (tmp / PLAN_FILE).write_text(checkpoint.plan.model_dump_json(indent=2) + "\n")

    _write_directory(out, fill, tokenizer_from)
    return out


def _write_directory(out: Path, fill, tokenizer_from: Path | None) -> None:
    """``fill`` a new directory with the tokenizer files of ``tokenizer_from`` beside, and move it to
    ``out`` (:func:`nibble.model.checkpoint_dir.write_directory`: complete or as it was)."""

    def fill_all(tmp: Path) -> None:
        fill(tmp)
        for name in TOKENIZER_FILES if tokenizer_from is not None else ():
            if (Path(tokenizer_from) / name).is_file():
                shutil.copyfile(Path(tokenizer_from) / name, tmp / name)

    write_directory(out, fill_all)


def _layout(name: str) -> Layout:
    if name not in LAYOUTS:
        raise ValueError(f"format {name!r} is not one of {sorted(LAYOUTS)}")
    return LAYOUTS[name]


def _detect(quantization: object, where: Path) -> Layout:
    if not isinstance(quantization, dict):
        raise ValueError(
            f"{where}: no quantization_config (not an NVFP4 checkpoint; a Nibble or plain HF checkpoint is "
            "read by `nibble import-model` / nibble.model.from_pretrained)"
        )
    for layout in LAYOUTS.values():
        if layout.matches(quantization):
            return layout
    raise ValueError(
        f"{where}: quantization_config.quant_method {quantization.get('quant_method')!r} is neither "
        "'compressed-tensors' nor 'modelopt'"
    )


def _unquantized_linears(dense: dict[str, torch.Tensor]) -> list[str]:
    """Modules that stay unquantised, for the layouts' ignore lists: every 2-D ``*.weight`` but the
    embedding (norms are 1-D; a tied LM head has no tensor of its own but is a linear of the engine)."""
    modules = [n.removesuffix(".weight") for n, t in dense.items() if n.endswith(".weight") and t.dim() == 2]
    linears = sorted(m for m in modules if not m.endswith("embed_tokens"))
    return linears if "lm_head" in linears else ["lm_head", *linears]


def _read_json(file: Path) -> dict:
    if not file.is_file():
        raise ValueError(f"{file}: missing (expected a checkpoint directory with {file.name})")
    try:
        content = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: not JSON ({exc})") from exc
    if not isinstance(content, dict):
        raise ValueError(f"{file}: not a JSON object")
    return content


def _read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """Every tensor of the directory's safetensors files, and the file each came from."""
    tensors, files = {}, {}
    for file in safetensors_files(path):
        for name, tensor in read_safetensors(file):
            if name in tensors:
                raise ValueError(f"{file}: tensor {name} also appears in {files[name]}")
            tensors[name], files[name] = tensor, file
    return tensors, files


def _modules(layout: Layout, tensors: dict[str, torch.Tensor], files: dict[str, Path]) -> dict[str, ModuleWeight]:
    modules = {}
    suffix = f".{layout.packed}"
    for name, tensor in tensors.items():
        if not name.endswith(suffix) or not layout.is_packed(tensor):
            continue
        module = name.removesuffix(suffix)
        parts = []
        for part in (layout.block, layout.global_):
            if f"{module}.{part}" not in tensors:
                raise ValueError(f"{files[name]}: {name} has no {module}.{part} (its NVFP4 {_ROLE[part]})")
            parts.append(tensors[f"{module}.{part}"])
        if parts[1].dtype != torch.float32 or parts[1].numel() != 1:
            raise ValueError(
                f"{files[name]}: {module}.{layout.global_} must be one float32, "
                f"got {str(parts[1].dtype).removeprefix('torch.')} {list(parts[1].shape)}"
            )
        if not bool(torch.isfinite(parts[1]).all() and (parts[1] > 0).all()):
            raise ValueError(
                f"{files[name]}: {module}.{layout.global_} is {parts[1].reshape(-1)[0].item()}, "
                "not a positive finite global scale"
            )
        weight = ModuleWeight(tensor, parts[0], layout.global_from_file(parts[1]))
        check_module(weight, f"{files[name]}: {module}")
        modules[module] = weight
    return modules


_ROLE = {
    "weight_scale": "block scales",
    "weight_global_scale": "global encode scale",
    "weight_scale_2": "global decode scale",
}


def _check_orphans(layout: Layout, dense: dict[str, torch.Tensor], files: dict[str, Path]) -> None:
    """A scale left over once every packed weight took its own means a packed weight is missing."""
    scale_suffixes = {f".{layout.block}", f".{layout.global_}", *(f".{s}" for s in layout.ignored)}
    for name in dense:
        if any(name.endswith(s) for s in scale_suffixes):
            module = name.rsplit(".", 1)[0]
            raise ValueError(f"{files[name]}: {name} has no packed weight {module}.{layout.packed} (uint8)")
