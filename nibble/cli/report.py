"""``nibble report``: reports from recorded results; ``nibble report stability RESULTS.json --out DIR
[--simulate]``, ``nibble report run DIR``."""

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
    simulate: Annotated[
        bool, typer.Option("--simulate", help="also the simulator's prediction for each run (simulate.md)")
    ] = False,
    calibrate: Annotated[
        list[Path] | None,
        typer.Option(help="--simulate: mismatch files for the floors (as nibble simulate --calibrate; repeatable)"),
    ] = None,
) -> None:
    """Spikes per 100 steps, collapses, final reward and accuracy, mean |Δlogprob| per variant (mean ± std
    over seeds) as a table, the article's claims judged on them by a fixed rule (claims.md), the mismatch by
    staleness (staleness.md), and grad-norm /
    reward / accuracy plots with seeds overlaid. With --simulate, the drift model driven by each run's plan
    and staleness beside the measured runs (simulate.md)."""
    from nibble.analysis import stability_claims
    from nibble.analysis.stability_report import (
        COLUMNS,
        load_results,
        markdown_table,
        plot,
        staleness_table,
        table_cells,
        variant_rows,
    )

    data = load_results(results)  # validates before anything is written
    if calibrate and not simulate:
        raise ValueError("--calibrate is for --simulate")
    comparison = _comparison(results, data, calibrate or []) if simulate else None
    _writable(out)
    rows = variant_rows(data)
    (out / "table.md").write_text(markdown_table(rows))
    verdicts = stability_claims.claims(data)
    (out / "claims.md").write_text(stability_claims.markdown(verdicts))
    (out / "staleness.md").write_text(staleness_table(data))
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
    rule = f"rule: nibble.analysis.stability_claims, {stability_claims.RULE}"
    judged = Table(title=f"the article's claims ({rule})")
    for column in ("claim", "verdict", "evidence"):
        judged.add_column(column)
    for claim in verdicts:
        judged.add_row(claim.claim, claim.verdict, claim.evidence)
    console.print(judged)
    console.print(f"table.md, claims.md, staleness.md and {', '.join(p.name for p in written)} in {out}")
    if comparison is not None:
        _print_comparison(console, out, *comparison)


def _comparison(results: Path, data: dict, calibrate: list[Path]):
    """``(rows, calibration, speed-ups, skipped)``: the floors from ``calibrate`` (else the article's); the
    step times from ``results`` when it holds them of a plan they calibrate (they do not enter the drift
    model; they give the speed-ups), else the speed-ups are skipped, saying why."""
    from nibble.analysis.stability_compare import compare, speed_ups
    from nibble.simulator.calibrate import NothingToCalibrate, load, published
    from nibble.simulator.stability_calibration import has_step_times

    calibration = load(calibrate) if calibrate else published()
    untimed = f"{results}: no step records generate_seconds (a file written before step times were recorded)"
    if has_step_times(data):
        try:
            calibration, untimed = load([results], base=calibration), None
        except NothingToCalibrate as exc:
            untimed = str(exc)
    try:
        rows = compare(data, calibration)
    except ValueError as exc:
        raise ValueError(f"{results}: {exc}") from None
    speeds, skipped = speed_ups(results, data, calibration) if untimed is None else ([], [f"every variant: {untimed}"])
    return rows, calibration, speeds, skipped


def _print_comparison(console, out: Path, rows, calibration, speeds, skipped) -> None:
    from rich.console import Console
    from rich.table import Table

    from nibble.analysis import stability_compare as compared

    (out / "simulate.md").write_text(compared.markdown(rows, calibration, speeds, skipped))
    wide = Console(width=240)
    table = Table(title="the drift model (docs/design.md §7) driven by each run's plan and staleness, vs measured")
    for column in compared.COLUMNS:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for cells in compared.table_cells(rows):
        table.add_row(*cells)
    wide.print(table)
    for name, value, source in calibration.rows():
        if name.startswith("floors."):
            console.print(f"  {name} = {value:.4g}  <- {source}")
    if speeds:
        table = Table(title=compared.speed_title())
        for column in compared.SPEED_COLUMNS:
            table.add_column(column, justify="left" if column == "variant" else "right")
        for cells in compared.speed_cells(speeds):
            table.add_row(*cells)
        wide.print(table)
    for line in skipped:
        console.print(f"  speed vs synchronous BF16 skipped: {line}", soft_wrap=True)
    console.print(f"simulate.md in {out}")


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
