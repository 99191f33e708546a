"""``nibble export-checkpoint`` / ``nibble import-checkpoint``: Nibble's NVFP4 weights in the
compressed-tensors and ModelOpt layouts that vLLM and SGLang load, and back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from nibble.cli.app import app, user_errors

Format = Literal["compressed-tensors", "modelopt"]


@app.command("export-checkpoint")
@user_errors
def export_checkpoint(
    source: Annotated[Path, typer.Argument(help="a Nibble checkpoint directory (config.json + safetensors)")],
    out: Annotated[Path, typer.Option("--out", help="directory to write")],
    format: Annotated[Format, typer.Option("--format", help="compressed-tensors | modelopt")],
    config: Annotated[
        Path | None, typer.Option("--config", help="run configuration whose `plan:` section to quantise under")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out directory")] = False,
) -> None:
    """Quantise SOURCE under the run's precision plan (as weight-sync does) and write it in FORMAT:
    compressed-tensors stores the global ENCODE scale (weight_global_scale), ModelOpt the DECODE scale
    (weight_scale_2); config.json says activations are NVFP4 with dynamic scales."""
    from nibble.config import load
    from nibble.interop import export_checkpoint as write
    from nibble.interop import from_model_dir
    from nibble.model import load_config
    from nibble.recipe import PrecisionPlan

    plan = PrecisionPlan.from_config(load(config).plan, load_config(source).num_hidden_layers)
    checkpoint = from_model_dir(source, plan)
    written = write(checkpoint, out, format, tokenizer_from=source, overwrite=overwrite)
    quantized = sum(name.endswith("::codes") for name in checkpoint.state)
    typer.echo(
        f"wrote {written} ({format}): {quantized} NVFP4 weight tensors (quantize={plan.quantize}, "
        f"four_over_six={plan.four_over_six}, BF16 layers {list(plan.bf16_layers)})"
    )


@app.command("import-checkpoint")
@user_errors
def import_checkpoint(
    source: Annotated[Path, typer.Argument(help="a compressed-tensors or ModelOpt NVFP4 directory")],
    out: Annotated[Path, typer.Option("--out", help="directory to write the Nibble checkpoint to")],
    dtype: Annotated[
        Literal["float32", "bfloat16"], typer.Option(help="float32 holds the decoded NVFP4 values exactly")
    ] = "float32",
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out directory")] = False,
) -> None:
    """Read SOURCE (its layout from config.json) and write a Nibble checkpoint that `model.checkpoint`
    loads: every NVFP4 weight decoded as Nibble decodes it, the other tensors as stored."""
    import torch

    from nibble.interop import import_checkpoint as read
    from nibble.interop import write_dequantized
    from nibble.model.checkpoint_dir import check_output

    check_output(out, overwrite=overwrite, source=source)  # before reading a large source
    checkpoint = read(source)
    written = write_dequantized(
        checkpoint, out, dtype=getattr(torch, dtype), tokenizer_from=source, overwrite=overwrite
    )
    quantized = sum(name.endswith("::codes") for name in checkpoint.state)
    plan = "its nibble_plan.json" if checkpoint.plan is not None else "no Nibble plan (another tool wrote it)"
    typer.echo(f"wrote {written}: {quantized} NVFP4 weight tensors decoded to {dtype}; {plan}")
