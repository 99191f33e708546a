"""``nibble check-contract``: does Nibble quantise a user's tensors bit for bit as Transformer Engine does,
and as its own other backends do (docs/design.md §2.2–2.3)?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors

MODES = {
    "per_tensor": ("per_tensor", None),
    "per_token": ("per_token", None),
    "per_tensor_46_mse": ("per_tensor", "mse"),
    "per_token_46_mse": ("per_token", "mse"),
    "per_tensor_46_mae": ("per_tensor", "mae"),
    "per_token_46_mae": ("per_token", "mae"),
}


@app.command("check-contract")
@user_errors
def check_contract(
    tensors: Annotated[Path, typer.Argument(help="a safetensors file (or a directory of them) to quantise")],
    te: Annotated[bool, typer.Option("--te", help="compare with Transformer Engine's reference quantiser")] = False,
    te_wheel: Annotated[
        Path | None, typer.Option(help="TE wheel to read the reference from (default: the installed TE)")
    ] = None,
    cuda: Annotated[bool, typer.Option("--cuda", help="also compare Nibble's CUDA backends")] = False,
    mode: Annotated[list[str] | None, typer.Option(help=f"modes to check (default all): {', '.join(MODES)}")] = None,
    max_rows: Annotated[int | None, typer.Option(min=1, help="check only the first rows of each tensor")] = None,
) -> None:
    """Quantise every floating-point tensor whose last dimension is a multiple of 16, per mode, and print
    per tensor whether the codes, block-scale bytes, global scales and 4/6 choices are identical.
    Exits 1 when anything differs."""
    import torch

    from nibble.kernels.te_reference import TEReference
    from nibble.model.safetensors_io import read_safetensors

    modes = mode or list(MODES)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"--mode {unknown[0]!r} is not one of {', '.join(MODES)}")
    if not te and not cuda:
        raise ValueError("nothing to compare against: pass --te (Transformer Engine) and/or --cuda")
    if cuda and not torch.cuda.is_available():
        raise ValueError("--cuda: no CUDA device is visible here")
    if not tensors.exists():
        raise ValueError(f"{tensors} does not exist")
    try:
        reference = TEReference(te_wheel) if te else None
    except FileNotFoundError as err:
        raise ValueError(str(err)) from None
    if reference is not None:
        typer.echo(f"Transformer Engine {reference.version} reference from {reference.origin}")

    disagreements = checked = 0
    for name, tensor in read_safetensors(tensors):
        if not tensor.dtype.is_floating_point or tensor.dim() == 0 or tensor.shape[-1] % 16 or tensor.numel() == 0:
            typer.echo(f"{name}: skipped ({tensor.dtype}, shape {tuple(tensor.shape)}: not float with K % 16 == 0)")
            continue
        if tensor.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            tensor = tensor.to(torch.float32)
        rows = tensor.reshape(-1, tensor.shape[-1])[:max_rows]
        if not torch.isfinite(rows).all():
            typer.echo(f"{name}: skipped (holds NaN or inf, which NVFP4 does not encode)")
            continue
        checked += 1
        for label in modes:
            scale, four_over_six = MODES[label]
            results = _compare_all(reference, rows, scale, four_over_six, cuda)
            for against, agreement in results.items():
                disagreements += not agreement.identical
                typer.echo(f"{name} [{tuple(rows.shape)}] {label} vs {against}: {agreement.describe()}")
    if checked == 0:
        raise ValueError(f"{tensors}: no floating-point tensor with a last dimension divisible by 16")
    typer.echo(f"{checked} tensors, {disagreements} disagreements")
    if disagreements:
        raise typer.Exit(1)


def _compare_all(reference, rows, scale: str, four_over_six: str | None, cuda: bool) -> dict:
    """Agreement of Nibble's CPU reference with TE, and of its CUDA backends with the CPU reference."""
    from nibble.kernels import contract

    out = {}
    if reference is not None:
        out["TE"] = contract.with_te(reference, rows, scale=scale, four_over_six=four_over_six)
    if cuda:
        for backend in ("reference", "triton"):
            out[f"cuda {backend}"] = contract.between_backends(
                rows, "cuda", backend, scale=scale, four_over_six=four_over_six
            )
    return out
