"""Hugging Face checkpoint adapter: read and write HF-format directories of the architectures in
:mod:`nibble.model.config` (Qwen3-MoE, Qwen2-MoE, Llama, Qwen2, Qwen3).

Reads both expert layouts found in the wild — the Hub's per-expert tensors
(``mlp.experts.{e}.gate_proj.weight`` …) and recent transformers' fused stacks
(``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``) — and writes the Hub's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from nibble.model.config import ModelConfig
from nibble.model.safetensors_io import read_safetensors
from nibble.model.transformer import MoETransformer
from nibble.recipe.plan import PrecisionPlan

_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def load_config(path: Path) -> ModelConfig:
    """The :class:`ModelConfig` of an HF directory's ``config.json`` (errors name the file)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"{path}: no config.json (expected an HF-format model directory)")
    try:
        hf = json.loads(file.read_text())
        return ModelConfig.from_hf(hf)
    except (json.JSONDecodeError, ValueError, TypeError) as exc:
        raise ValueError(f"{file}: {exc}") from exc


def from_pretrained(path, *, plan: PrecisionPlan | None = None, dtype: torch.dtype = torch.float32) -> MoETransformer:
    """Load an HF-format directory (config.json + safetensors, sharded or not) into a :class:`MoETransformer`.

    Args:
        path: the model directory.
        plan: the precision plan (default: all BF16 for the model's layer count).
        dtype: dtype of the master weights (float32 for training).
    Raises:
        ValueError: listing missing and unexpected tensors, naming any tensor whose shape disagrees with
            config.json, or a plan built for another number of layers.
    """
    path = Path(path)
    return model_from_state(load_config(path), read_weights(path), where=str(path), plan=plan, dtype=dtype)


def model_from_state(
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    *,
    where: str,
    plan: PrecisionPlan | None = None,
    dtype: torch.dtype = torch.float32,
) -> MoETransformer:
    """Build a :class:`MoETransformer` from HF-named tensors (either expert layout; a tied model's
    ``lm_head.weight`` may be present as a copy of the embedding).

    Args:
        config: the model's configuration.
        state: tensors by HF name (any float dtype); consumed.
        where: the tensors' origin, named in errors (a directory, a GGUF file).
        plan: the precision plan (default: all BF16 for the model's layer count).
        dtype: dtype of the master weights.
    Raises:
        ValueError: as :func:`from_pretrained`.
    """
    model = MoETransformer(config, plan)
    state = _fuse_experts(state, config)
    if config.tie_word_embeddings:
        _drop_tied_head(state, where)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if config.tie_word_embeddings and "lm_head.weight" in missing:
        missing.remove("lm_head.weight")
    if missing or unexpected:
        raise ValueError(f"{where}: missing tensors {_listing(missing)}; unexpected tensors {_listing(unexpected)}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{where}: tensor {name} has shape {tuple(tensor.shape)}, "
                f"config.json implies {tuple(expected[name].shape)}"
            )
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=not config.tie_word_embeddings)
    return model.to(dtype)


def _drop_tied_head(state: dict[str, torch.Tensor], where: str) -> None:
    """A tied checkpoint may still store ``lm_head.weight`` (some exporters write both): accept it only as
    a copy of the embedding, which is the one tensor the model keeps."""
    head, embed = state.pop("lm_head.weight", None), state.get("model.embed_tokens.weight")
    if head is not None and embed is not None and not torch.equal(head, embed):
        raise ValueError(
            f"{where}: config.json says tie_word_embeddings=true but lm_head.weight differs from "
            "model.embed_tokens.weight (set tie_word_embeddings=false to keep a separate head)"
        )


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model's tensors: the shards named by ``model.safetensors.index.json``, else
    ``model.safetensors``, else every ``*.safetensors`` file of the directory."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{index}: not a safetensors index ({exc})") from exc
        state = {}
        for shard in shards:
            state.update(read_safetensors(path / shard))
        return state
    single = path / "model.safetensors"
    state: dict[str, torch.Tensor] = {}
    for name, tensor in read_safetensors(single if single.is_file() else path):
        if name in state:
            raise ValueError(f"{path}: tensor {name} appears in more than one *.safetensors file")
        state[name] = tensor
    return state


def _listing(names: list[str], limit: int = 12) -> str:
    if len(names) <= limit:
        return str(names)
    return f"{names[:limit]} and {len(names) - limit} more"


def _fuse_experts(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Stack per-expert tensors into ``gate_up_proj`` / ``down_proj``; fused tensors pass through."""
    parts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    out = {}
    for name, tensor in state.items():
        match = _PER_EXPERT.match(name)
        if match is None:
            out[name] = tensor
            continue
        prefix, expert, proj = match.group(1), int(match.group(2)), match.group(3)
        parts.setdefault(prefix, {}).setdefault(proj, {})[expert] = tensor
    for prefix, projections in parts.items():
        experts = range(config.num_experts)
        absent = [
            f"{prefix}.{e}.{p}.weight"
            for p in ("gate_proj", "up_proj", "down_proj")
            for e in experts
            if e not in projections.get(p, {})
        ]
        extra = [f"{prefix}.{e}.{p}.weight" for p, per in projections.items() for e in per if e >= config.num_experts]
        if absent or extra:
            raise ValueError(
                f"expert tensors: missing {absent[:8]}{'…' if len(absent) > 8 else ''}; unexpected {extra}"
            )
        gate, up, down = (
            torch.stack([projections[p][e] for e in experts]) for p in ("gate_proj", "up_proj", "down_proj")
        )
        if gate.shape != up.shape:
            raise ValueError(f"{prefix}: gate_proj {tuple(gate.shape[1:])} and up_proj {tuple(up.shape[1:])} differ")
        out[f"{prefix}.gate_up_proj"] = torch.cat((gate, up), dim=1)
        out[f"{prefix}.down_proj"] = down
    return out


def save_pretrained(model: MoETransformer, path, *, dtype: torch.dtype = torch.float32) -> None:
    """Write ``config.json`` and ``model.safetensors`` in the Hub's per-expert layout.

    Raises:
        ValueError: for a packed (sampler-form) model, whose quantised weights are no longer dense.
    """
    path = Path(path)
    state = model.state_dict()
    if any(v is None for v in state.values()) or any(getattr(m, "packed", None) is not None for m in model.modules()):
        raise ValueError("save_pretrained needs the trainer-form model (this one is packed for sampling)")
    tensors = {}
    inter = model.config.moe_intermediate_size
    for name, tensor in state.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix = name.removesuffix(".gate_up_proj")
            for e in range(tensor.shape[0]):
                tensors[f"{prefix}.{e}.gate_proj.weight"] = tensor[e, :inter]
                tensors[f"{prefix}.{e}.up_proj.weight"] = tensor[e, inter:]
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name.removesuffix(".down_proj")
            for e in range(tensor.shape[0]):
                tensors[f"{prefix}.{e}.down_proj.weight"] = tensor[e]
        elif not (model.config.tie_word_embeddings and name == "lm_head.weight"):
            tensors[name] = tensor
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    write_config(model.config, path, dtype=dtype)


def write_config(config: ModelConfig, path, *, dtype: torch.dtype = torch.float32) -> None:
    """Write ``config.json`` (HF keys; ``torch_dtype`` names the weights' dtype) into directory ``path``."""
    (Path(path) / "config.json").write_text(
        json.dumps({**config.to_hf(), "torch_dtype": str(dtype).removeprefix("torch.")}, indent=2) + "\n"
    )
