"""``nibble report``: reports from recorded results; ``nibble report stability RESULTS.json --out DIR``,
``nibble report run DIR``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors

report_app = typer.Typer(help="Reports from recorded runs and benchmark results.", no_args_is_help=True)
app.add_typer(report_app, name="report")


@report_app.command("stability")
@user_errors
def stability(
    results: Annotated[Path, typer.Argument(help="results JSON written by benchmarks/stability/")],
    out: Annotated[Path, typer.Option(help="directory for table.md and the PNG plots")] = Path("out/stability"),
) -> None:
    """Spikes per 100 steps, collapses, final reward and accuracy, mean |Δlogprob| per variant (mean ± std
    over seeds) as a table, and grad-norm / reward / accuracy plots with seeds overlaid."""
    from nibble.analysis.stability_report import COLUMNS, load_results, markdown_table, plot, table_cells, variant_rows

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


@report_app.command("run")
@user_errors
def run(
    run_dir: Annotated[Path, typer.Argument(help="a `nibble run --out` directory")],
    out: Annotated[Path | None, typer.Option(help="PNG to write; default: DIR/dashboard.png")] = None,
) -> None:
    """The Grafana dashboard's main panels as one PNG: from the run's Prometheus TSDB (`nibble run
    --prometheus`), else from the trainer's metrics.jsonl (the panels it records)."""
    from nibble.launcher import free_port
    from nibble.monitoring import report

    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: no such run directory")
    panels = report.main_panels()
    window = report.run_window(run_dir)  # validates before anything starts
    if (run_dir / "prometheus" / "data").is_dir():
        try:
            data, source = report.from_tsdb(run_dir, panels, free_port()), "its Prometheus TSDB"
        except RuntimeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
    else:
        data, source = report.from_records(run_dir, panels), "metrics.jsonl (run with --prometheus for every panel)"
    path = out or run_dir / "dashboard.png"
    _writable(path.parent)
    minutes = (window[1] - window[0]) / 60
    report.render(panels, data, path, f"{run_dir.name}: {minutes:.1f} minutes, from {source}")
    typer.echo(f"{path}: {sum(bool(data.get(p.title)) for p in panels)} of {len(panels)} main panels, from {source}")


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create the directory ({exc.strerror or exc})") from None
    if not out.is_dir():
        raise ValueError(f"--out {out}: not a directory")
