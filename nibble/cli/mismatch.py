"""``nibble mismatch``: train/rollout mismatch of every precision plan on a warm start or a run config's model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors


@app.command("mismatch")
@user_errors
def mismatch(
    checkpoint: Annotated[Path | None, typer.Option(help="a checkpoint directory written by `nibble sft`")] = None,
    config: Annotated[
        Path | None, typer.Option(help="instead: a run config, for its model, task and plan.quantize")
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="cpu, cuda or cuda:N (default: the config's trainer.device, else cpu)")
    ] = None,
    prompts: Annotated[int, typer.Option(min=1, help="training prompts sampled per plan")] = 128,
    temperature: Annotated[float, typer.Option(min=0.01, help="sampling and scoring temperature")] = 1.0,
    seed: Annotated[int, typer.Option(help="seed of the prompts and of sampling")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Sample with each plan's sampler, score on the trainer side; print mean |Δlogprob| and k3 KL."""
    from nibble.analysis.mismatch_report import as_json as rows_json
    from nibble.analysis.mismatch_report import measure, source_of
    from nibble.cli.progress import Progress

    source = source_of(checkpoint, config, device)

    with Progress("precision plans", 0, unit="plans") as bar:

        def progress(done: int, total: int, plan: str) -> None:
            bar.set_total(total)
            if done:
                bar.advance(note=plan)

        rows = measure(source, prompts=prompts, temperature=temperature, seed=seed, progress=progress)
    if as_json:
        typer.echo(json.dumps(rows_json(rows), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"train/rollout mismatch, {source.checkpoint} on {source.device}")
    for column in ("plan", "trainer", "mean |Δlogprob|", "k3 KL", "tokens"):
        table.add_column(column, justify="left" if column in ("plan", "trainer") else "right")
    for r in rows:
        table.add_row(r.plan, r.trainer, f"{r.logprob_abs_diff:.4g}", f"{r.mismatch_kl:.3g}", str(r.tokens))
    Console(width=140).print(table)
