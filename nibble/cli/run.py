"""``nibble run``: the whole system on one machine — Redis, weight-sync, trainer and samplers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors


@app.command("run")
@user_errors
def run(
    config: Annotated[
        Path | None, typer.Option(help="run configuration (YAML); default: configs/default.yaml's values")
    ] = None,
    out: Annotated[Path, typer.Option(help="run directory: logs, checkpoints, metrics, summary, plots")] = Path(
        "runs/default"
    ),
    redis_url: Annotated[str | None, typer.Option(help="use this Redis instead of starting a private one")] = None,
    prometheus: Annotated[
        bool, typer.Option(help="a local Prometheus scrapes every service (alert + recording rules); TSDB in OUT")
    ] = False,
) -> None:
    """Train with NVFP4 rollouts: samplers and the trainer run concurrently as separate processes."""
    from nibble.config import load

    loaded = load(config)
    from nibble.launcher import check_devices, launch

    check_devices(loaded)  # refusals come before a warm start is trained or anything started
    if prometheus:
        _require_prometheus()
    from rich.console import Console

    from nibble.run_report import plot, summarize

    console = Console()
    _ensure_warm_start(loaded, console)
    offset = {"bytes": 0}
    total = loaded.trainer.total_steps

    def progress(run_dir: Path) -> None:
        path = run_dir / "metrics.jsonl"
        if not path.is_file():
            return
        with path.open("rb") as handle:  # only what the trainer appended since the last look
            handle.seek(offset["bytes"])
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        offset["bytes"] += len(complete)
        for line in map(json.loads, complete.decode().splitlines()):
            if line["step"] == 0:
                typer.echo(f"warm start: held-out accuracy {line['eval_accuracy']:.3f}")
                continue
            acc = line.get("eval_accuracy")
            typer.echo(
                f"step {line['step']:4d}/{total}  reward {line['reward_mean']:.3f}  "
                f"eval {'-' if acc is None else f'{acc:.3f}'}  |Δlogprob| {line['logprob_abs_diff']:.4f}  "
                f"staleness {line['staleness_mean']:.2f}  version {line['policy_version']}"
            )

    started = time.time()
    try:
        effective = launch(
            loaded,
            out,
            redis_url=redis_url,
            on_progress=progress,
            prometheus=prometheus,
            announce=lambda url: typer.echo(f"prometheus: {url} (TSDB in {out / 'prometheus'})"),
        )
    except RuntimeError as exc:  # a service failed; the message names it and its log
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    summary = summarize(out, effective, time.time() - started)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(out)
    keys = ("steps", "eval_accuracy_before", "eval_accuracy_after", "final_reward", "wall_seconds", "mean_staleness")
    console.print({k: summary[k] for k in keys})
    console.print(f"summary, metrics.jsonl and plots in {out}")
    if prometheus:
        console.print(f"dashboard panels as PNG: nibble report run {out}")


def _require_prometheus() -> None:
    from nibble.monitoring.prometheus import binary

    try:
        binary()
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _ensure_warm_start(config, console) -> None:
    """Train the SFT warm start when the config's checkpoint does not exist yet; warn when an existing
    one was trained (by ``nibble sft``) on another task than the run's."""
    checkpoint = config.model.checkpoint
    if (checkpoint / "config.json").is_file():
        _warn_on_other_task(config, checkpoint, console)
        return
    import torch

    from nibble.sft import save_warm_start, train_sft
    from nibble.tasks import get_task

    console.print(f"no warm start at {checkpoint}: training one (nibble sft)")
    torch.set_num_threads(config.model.sft_threads)
    with get_task(config.task.name, **config.task.options) as task:
        model, result = train_sft(
            task, steps=config.model.sft_steps, target_accuracy=config.model.sft_target_accuracy, seed=config.seed
        )
        save_warm_start(model, result, {"name": config.task.name, "options": config.task.options}, checkpoint)
    console.print(f"warm start: {result.steps} steps, held-out accuracy {result.eval_accuracy:.3f}")


def _warn_on_other_task(config, checkpoint: Path, console) -> None:
    from nibble.sft import SFT_RECORD

    record = checkpoint / SFT_RECORD
    if not record.is_file():
        return  # not made by `nibble sft` (an imported model): nothing to compare
    trained = json.loads(record.read_text()).get("task")
    wanted = {"name": config.task.name, "options": config.task.options}
    if trained != wanted:
        console.print(
            f"[yellow]warning:[/] the warm start at {checkpoint} was trained on task {trained}, this run's task is "
            f"{wanted}; remove it to have a matching one trained, or set model.checkpoint"
        )
