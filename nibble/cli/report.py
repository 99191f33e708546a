"""``nibble report``: reports from recorded results; ``nibble report stability RESULTS.json --out DIR``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors

report_app = typer.Typer(help="Reports from recorded benchmark results.", no_args_is_help=True)
app.add_typer(report_app, name="report")


@report_app.command("stability")
@user_errors
def stability(
    results: Annotated[Path, typer.Argument(help="results JSON written by benchmarks/stability.py")],
    out: Annotated[Path, typer.Option(help="directory for table.md and the PNG plots")] = Path("out/stability"),
) -> None:
    """Spikes per 100 steps, collapses, final reward and accuracy, mean |Δlogprob| per variant (mean ± std
    over seeds) as a table, and grad-norm / reward / accuracy plots with seeds overlaid."""
    from nibble.stability_report import COLUMNS, load_results, markdown_table, plot, table_cells, variant_rows

    data = load_results(results)  # validates before anything is written
    _writable(out)
    rows = variant_rows(data)
    (out / "table.md").write_text(markdown_table(rows))
    written = plot(data, out)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"stability, {results} (mean ± std over seeds)")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for cells in table_cells(rows):
        table.add_row(*cells)
    console = Console(width=180)
    console.print(table)
    console.print(f"table.md and {', '.join(p.name for p in written)} in {out}")


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create the directory ({exc.strerror or exc})") from None
    if not out.is_dir():
        raise ValueError(f"--out {out}: not a directory")
