"""``nibble simulate``: the throughput–stability simulator (docs/design.md §7) — one run, or ``--optimize``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors

DEFAULT_OUT = Path("out/simulate")
SINGLE_FILES = ("result.json", "simulation.png", "simulation.html")
OPTIMIZE_FILES = ("frontier.json", "frontier.md")


@app.command("simulate")
@user_errors
def simulate(
    precision: Annotated[str, typer.Option(help="rollout precision: bf16 | mxfp8 | nvfp4")] = "nvfp4",
    four_over_six: Annotated[bool, typer.Option(help="NVFP4 four-over-six block scaling")] = True,
    dequantized_backward: Annotated[
        bool, typer.Option(help="backward on dequantised operands (else high precision)")
    ] = True,
    bf16_last_15: Annotated[
        bool, typer.Option("--bf16-last-15/--no-bf16-last-15", help="last 15% of layers in BF16")
    ] = True,
    bf16_shared_experts: Annotated[bool, typer.Option(help="shared experts in BF16")] = True,
    max_staleness: Annotated[
        int, typer.Option(help="versions a trajectory may lag the trainer, 0..8 (0 = synchronous)")
    ] = 1,
    weight_sync: Annotated[bool, typer.Option(help="model the weight-sync pause of each sampler")] = True,
    inflight_updates: Annotated[
        bool, typer.Option(help="swap weights inside rollouts in flight (PipelineRL-style)")
    ] = False,
    batch: Annotated[int, typer.Option(help="trajectory groups per train step: 4 | 8 | 16")] = 8,
    horizon: Annotated[
        str, typer.Option(help="response lengths: short (2k) | medium (8k) | long (32k, heavy tail)")
    ] = "medium",
    num_samplers: Annotated[int, typer.Option(help="samplers, one group in flight each (1..64)")] = 8,
    steps: Annotated[int, typer.Option(help="train steps to simulate")] = 200,
    seed: Annotated[int, typer.Option(help="seed of the timeline and the gradient spikes")] = 0,
    out: Annotated[
        Path, typer.Option(help="folder for result.json, simulation.png, simulation.html (or frontier.*)")
    ] = DEFAULT_OUT,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
    optimize: Annotated[
        bool, typer.Option("--optimize", help="search the knobs; print the throughput-vs-stability frontier")
    ] = False,
    seeds: Annotated[int, typer.Option(help="--optimize: seeds per configuration")] = 2,
    max_samplers: Annotated[int, typer.Option(help="--optimize: most samplers to try")] = 16,
    top: Annotated[int, typer.Option(help="--optimize: frontier rows to print (0 = all)")] = 12,
    calibrate: Annotated[
        list[Path] | None,
        typer.Option(help="mismatch JSON or run directory with measured floors/step times (repeatable)"),
    ] = None,
) -> None:
    """Simulate samplers, trainer and weight sync with the drift model; write plots and an interactive page."""
    from nibble.simulator import SimConfig, load, published

    config = SimConfig(
        precision=precision, four_over_six=four_over_six, dequantized_backward=dequantized_backward,
        bf16_last_15=bf16_last_15, bf16_shared_experts=bf16_shared_experts, max_staleness=max_staleness,
        weight_sync=weight_sync, inflight_updates=inflight_updates, batch=batch, horizon=horizon,
        num_samplers=num_samplers, steps=steps, seed=seed,
    )  # fmt: skip
    calibration = load(list(calibrate)) if calibrate else published()
    # Before any work: a bad --out fails now, not after the run (or the whole --optimize search).
    _prepare_out(out, OPTIMIZE_FILES if optimize else SINGLE_FILES)
    if optimize:
        _optimize(config, calibration, out, as_json, seeds=seeds, max_samplers=max_samplers, top=top)
    else:
        _single(config, calibration, out, as_json)


def _prepare_out(out: Path, names: tuple[str, ...]) -> None:
    """Create the output folder ``out`` and check that ``names`` can be written in it.

    Raises:
        ValueError: (exit 2) when ``out`` is a file, cannot be created, is not writable, or holds a folder
            where one of ``names`` goes.
    """
    import tempfile

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    for name in names:
        if (out / name).exists() and not (out / name).is_file():
            raise ValueError(f"--out {out}: {out / name} is in the way (not a file)")


def _single(config, calibration, out: Path, as_json: bool) -> None:
    from nibble.simulator import simulate
    from nibble.simulator.page import write_html
    from nibble.simulator.plots import write_png
    from nibble.simulator.simulate import mixed_step_times

    result = simulate(config, calibration)
    files = {
        "result": str(_write_json(out / "result.json", _result_record(result))),
        "png": str(write_png(result, out / "simulation.png")),
        "html": str(write_html(config, calibration, out / "simulation.html")),
    }
    mixed = mixed_step_times(config, calibration)
    record = {"config": config.as_dict(), "summary": result.summary(), "calibration": calibration.as_dict()}
    if as_json:
        typer.echo(json.dumps(record | {"files": files, "mixed_step_times": mixed}, indent=2))
        _warn_mixed(mixed, "speed_vs_sync_bf16")
        return
    _print_summary(result.summary())
    _print_sources(calibration)
    _warn_mixed(mixed, "speed_vs_sync_bf16")
    for name, path in files.items():
        typer.echo(f"{name}: {path}")


def _warn_mixed(mixed: list[str], what: str) -> None:
    """On stderr: ``what`` sets measured step times beside published ones (``mixed``), so it is no speed-up."""
    if mixed:
        typer.echo(
            f"warning: {what} sets step times from different sources side by side: no speed-up; "
            "calibrate all of them from one source, or simulate the plan that was measured:\n  " + "\n  ".join(mixed),
            err=True,
        )


def _result_record(result) -> dict:
    run = result.run

    def curves(r) -> dict:
        return {
            "step_end_seconds": [s.end for s in r.timeline.steps],
            "mismatch": r.dynamics.mismatch,
            "drift": r.dynamics.drift,
            "reward": r.dynamics.reward,
            "spike_steps": r.dynamics.spikes,
            "verdict": r.dynamics.verdict,
        }

    return {
        "config": run.config.as_dict(),
        "summary": result.summary(),
        "calibration": result.calibration.as_dict(),
        "curves": curves(run),
        "ghosts": {p: curves(g) for p, g in result.ghosts.items()},
    }


def _write_json(path: Path, record: dict) -> Path:
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _print_summary(summary: dict) -> None:
    from rich.table import Table

    table = Table(title="nibble simulate", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    for key, value in summary.items():
        table.add_row(key, _number(value))
    _console().print(table)


def _number(value) -> str:
    if not isinstance(value, float):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _print_sources(calibration) -> None:
    """Which numbers came from where: each measured replacement on its own line, the rest summarised; the
    pauses still illustrative are named, as a file timing some formats leaves the others' pauses as they were."""
    from nibble.simulator.calibrate import DEFAULT_SOURCES, PUBLISHED_SOURCE, WEIGHT_SYNC_SOURCE

    rows = calibration.rows()
    typer.echo("inputs and where they came from:")
    for name, value, source in rows:
        if source not in DEFAULT_SOURCES:
            typer.echo(f"  {name} = {value:.4g}  <- {source}")
    replaced = any(source not in DEFAULT_SOURCES for _, _, source in rows)
    if any(source == PUBLISHED_SOURCE for _, _, source in rows):
        typer.echo(f"  {'other ' if replaced else ''}floors and step times: {PUBLISHED_SOURCE}")
    kept = [(name, value) for name, value, source in rows if source == WEIGHT_SYNC_SOURCE]
    if len(kept) == len(calibration.weight_sync_seconds):
        typer.echo(f"  weight_sync (every format) = {kept[0][1]:g} s: {WEIGHT_SYNC_SOURCE}")
    elif kept:
        names = ", ".join(name for name, _ in kept)
        why = "kept: no calibration file timed a run of the plan each is measured under"
        typer.echo(f"  {names} = {kept[0][1]:g} s: {WEIGHT_SYNC_SOURCE} ({why})")


def _console():
    """A rich console; when output is not a terminal (a pipe, a file), wide enough not to wrap the tables."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def _optimize(config, calibration, out: Path, as_json: bool, *, seeds: int, max_samplers: int, top: int) -> None:
    from nibble.simulator import optimize
    from nibble.simulator.simulate import mixed_sources

    if top < 0:
        raise ValueError(f"top={top} must be at least 0 (--top)")
    candidates = optimize.search(config, calibration, seeds=seeds, max_samplers=max_samplers)
    step_times = [name for name in calibration.sources if name.startswith(("rollout.", "train.", "weight_sync."))]
    mixed = mixed_sources(calibration, step_times)
    front = optimize.frontier(candidates)
    record = {
        "workload": {k: config.as_dict()[k] for k in ("batch", "horizon", "weight_sync", "inflight_updates", "steps")},
        "reference": f"synchronous BF16 with {config.num_samplers} samplers",
        "seeds": [(config.seed + i) % 2**32 for i in range(seeds)],
        "searched": len(candidates),
        "stable": sum(c.stable for c in candidates),
        "frontier": [c.as_dict() for c in front],
        "calibration": calibration.as_dict(),
        "mixed_step_times": mixed,
    }
    _write_json(out / "frontier.json", record)
    (out / "frontier.md").write_text(optimize.markdown_table(front, top or None))
    if as_json:
        typer.echo(json.dumps(record, indent=2))
        _warn_mixed(mixed, "the frontier's speed-ups")
        return
    _print_frontier(optimize, front, record, top)
    _print_sources(calibration)
    _warn_mixed(mixed, "the frontier's speed-ups")
    typer.echo(f"frontier: {out / 'frontier.json'}, {out / 'frontier.md'}")


def _print_frontier(optimize, front, record: dict, top: int) -> None:
    from rich.table import Table

    w = record["workload"]
    title = (
        f"frontier, best first: {record['searched']} configurations × {len(record['seeds'])} seeds, "
        f"{record['stable']} stable (batch {w['batch']}, {w['horizon']} horizon, {w['steps']} steps); "
        f"speed vs {record['reference']}"
    )
    table = Table(title=title)
    for column in optimize.FRONTIER_COLUMNS:
        table.add_column(column, justify="right")
    for row in optimize.frontier_rows(front[:top] if top else front):
        table.add_row(*row)
    _console().print(table)
    if not front:
        typer.echo("no configuration is stable on every seed: nothing is on the frontier")
