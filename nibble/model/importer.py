"""Import a pretrained causal LM — a GGUF file or an HF-format directory — as Nibble's checkpoint.

The output is an HF-format directory that :func:`nibble.model.from_pretrained` (and transformers) load:
``config.json`` written by Nibble from its :class:`~nibble.model.ModelConfig` (so it never carries a
source's ``quantization_config``: a checkpoint re-saved from a GGUF load keeps one, and transformers then
runs it several times slower), ``model.safetensors``, and the tokenizer as ``tokenizer.json`` plus
``tokenizer_config.json`` holding the model's chat template.

GGUF files are read by transformers (``gguf_file=``, with the ``gguf`` package), which dequantises every
tensor to float32 and undoes llama.cpp's renaming and q/k permutation. The weights are stored as
``dtype`` (bfloat16 by default: Nibble's forward reads every weight through its bf16 cast, so bf16
storage loses nothing the model computes with).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from nibble.model.checkpoint_dir import check_output, write_directory
from nibble.model.config import ModelConfig
from nibble.model.hf import load_config, model_from_state, read_weights

GGUF_ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
}
"""GGUF ``general.architecture`` values Nibble imports, and the HF ``model_type`` each becomes."""

_NOT_CAUSAL = {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "t5encoder", "clip", "wavtokenizer-dec"}
"""GGUF architectures of encoders and other models that do not generate text left to right."""

_GGUF_MAGIC = b"GGUF"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class Imported:
    """What :func:`import_model` wrote."""

    out: Path
    config: ModelConfig
    parameters: int
    dtype: torch.dtype
    chat_template: bool


def import_model(source, out, *, dtype: torch.dtype = torch.bfloat16, overwrite: bool = False) -> Imported:
    """Convert ``source`` (a ``.gguf`` file or an HF-format directory) into Nibble's checkpoint at ``out``.

    The directory appears complete or not at all (written beside ``out``, then renamed into place).

    Args:
        source: a GGUF file, or a directory with ``config.json``, safetensors weights and a tokenizer.
        out: the directory to write; it must not exist (or be empty) unless ``overwrite``.
        dtype: weight dtype on disk, ``torch.bfloat16`` or ``torch.float32``.
        overwrite: replace an existing non-empty ``out``.
    Raises:
        ValueError: naming the problem — a missing source, a file that is not GGUF, a GGUF that is not a
            causal LM or of an unsupported architecture (named), an HF directory of an unsupported
            architecture or without a tokenizer, an existing ``out``, an unsupported ``dtype``.
    """
    source, out = Path(source), Path(out)
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {dtype} is not supported; use bfloat16 or float32")
    if not source.exists():
        raise ValueError(f"{source}: no such file or directory")
    check_output(out, overwrite=overwrite, source=source)
    if source.is_file():
        config, state, tokenizer = _read_gguf(source)
    else:
        config, state, tokenizer = _read_hf_directory(source)
    model = model_from_state(config, state, where=str(source), dtype=torch.float32)
    chat_template = False

    def fill(staging: Path) -> None:
        nonlocal chat_template
        model.save_pretrained(staging, dtype=dtype)
        chat_template = _write_tokenizer(tokenizer, staging)

    write_directory(out, fill)
    return Imported(out, config, model.num_parameters(), dtype, chat_template)


def _transformers():
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader requires it)
        import gguf  # noqa: F401
        import transformers
    except ImportError as exc:
        raise ValueError(
            f"importing a model needs transformers, gguf and accelerate ({exc}); pip install 'nibble[import]'"
        ) from exc
    return transformers


def _read_gguf(path: Path):
    """``(config, state, tokenizer)`` of a GGUF file, after checking it holds a supported causal LM."""
    with path.open("rb") as handle:
        if handle.read(4) != _GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file (no GGUF magic); pass a .gguf file or an HF model directory")
    transformers = _transformers()
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as exc:
        raise ValueError(f"{path}: unreadable GGUF file ({exc})") from exc
    kind = _field(reader, "general.type")
    if kind not in (None, "model"):
        raise ValueError(f"{path}: a GGUF of general.type={kind!r}, not a model (an adapter or vocabulary file?)")
    arch = _field(reader, "general.architecture")
    if arch in _NOT_CAUSAL:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not a causal LM (an encoder); Nibble trains those")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported; Nibble imports {', '.join(GGUF_ARCHITECTURES)}"
        )
    names = {t.name for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise ValueError(f"{path}: holds no token_embd.weight tensor (a vocabulary-only GGUF?), not a model")
    # transformers' GGUF loader reads rope.freq_base alone: scaled RoPE (Llama 3.1's rope_freqs.weight,
    # YaRN's rope.scaling.*) would import as plain RoPE and compute other logits without a word.
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if "rope_freqs.weight" in names or scaling not in (None, "none"):
        raise ValueError(
            f"{path}: scaled RoPE ({'rope_freqs.weight' if scaling in (None, 'none') else scaling}) is not "
            "imported from GGUF (transformers' GGUF loader drops it); import the model's HF directory instead"
        )
    where = dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name)
    try:
        hf_config = transformers.AutoConfig.from_pretrained(**where)
    except Exception as exc:  # transformers raises many kinds; each is this file's problem
        raise ValueError(f"{path}: transformers could not read this GGUF ({type(exc).__name__}: {exc})") from exc
    config = _model_config(hf_config.to_dict(), path)
    try:
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(**where)
    except Exception as exc:
        raise ValueError(f"{path}: transformers could not read this GGUF ({type(exc).__name__}: {exc})") from exc
    state = {name: tensor.detach() for name, tensor in hf_model.state_dict().items()}
    return config, state, tokenizer


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _model_config(hf: dict, where: Path) -> ModelConfig:
    try:
        return ModelConfig.from_hf(hf)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _read_hf_directory(path: Path):
    """``(config, state, tokenizer)`` of an HF-format model directory."""
    config = load_config(path)
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ValueError(f"{path}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json) beside config.json")
    transformers = _transformers()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # transformers raises many kinds: each is this folder's problem
        raise ValueError(f"{path}: transformers could not load its tokenizer ({type(exc).__name__}: {exc})") from exc
    return config, read_weights(path), tokenizer


def _write_tokenizer(tokenizer, path: Path) -> bool:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with ``chat_template`` inside it, where
    readers of the tokenizer config look for it); returns whether the model has a chat template."""
    tokenizer.save_pretrained(str(path))
    template = tokenizer.chat_template
    for extra in path.glob("chat_template.*"):  # recent transformers write the template to its own file
        extra.unlink()
    config_file = path / "tokenizer_config.json"
    settings = json.loads(config_file.read_text())
    if template is not None:
        settings["chat_template"] = template
    config_file.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
    for name in TOKENIZER_FILES:
        if not (path / name).is_file():
            raise ValueError(f"the tokenizer did not save {name} (a slow-only tokenizer?)")
    return template is not None
