"""``nibble import-model``: a GGUF file or an HF-format directory → Nibble's HF-format checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from nibble.cli.app import app, user_errors


@app.command("import-model")
@user_errors
def import_model(
    source: Annotated[Path, typer.Argument(help="a .gguf file, or an HF model directory (config.json + safetensors)")],
    out: Annotated[Path, typer.Option("--out", help="directory to write the checkpoint to")],
    dtype: Annotated[
        Literal["bfloat16", "float32"], typer.Option(help="weight dtype on disk (the model computes from bf16 casts)")
    ] = "bfloat16",
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out directory")] = False,
) -> None:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json (with the chat
    template) that `nibble run` loads as its checkpoint. Architectures: Llama, Qwen2, Qwen3 (dense),
    Qwen2-MoE, Qwen3-MoE."""
    import torch

    from nibble.model.importer import import_model as run_import

    result = run_import(source, out, dtype=getattr(torch, dtype), overwrite=overwrite)
    c = result.config
    typer.echo(
        f"wrote {result.out}: {c.architecture}, {result.parameters / 1e6:.1f} M parameters, "
        f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}, "
        f"tied embeddings {'yes' if c.tie_word_embeddings else 'no'}, {dtype} weights, "
        f"chat template {'yes' if result.chat_template else 'none (a base model?)'}"
    )
    if not c.is_moe:
        typer.echo("dense model: quantise its MLPs for NVFP4 rollouts with plan.quantize: all_linear")
