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
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue the stopped run in --out (its recorded config; a finished run is left alone unless "
            "trainer.total_steps is raised)",
        ),
    ] = False,
    new: Annotated[
        bool, typer.Option("--new", help="--out holds a run: start a new one in the next free DIR-2, DIR-3, ...")
    ] = False,
    redis_url: Annotated[str | None, typer.Option(help="use this Redis instead of starting a private one")] = None,
    prometheus: Annotated[
        bool, typer.Option(help="a local Prometheus scrapes every service (alert + recording rules); TSDB in OUT")
    ] = False,
) -> None:
    """Train with NVFP4 rollouts: samplers and the trainer run concurrently as separate processes.

    A folder that holds a run is never overwritten: without --resume or --new, nibble run refuses it.
    """
    from nibble.cli.run_config import run_config
    from nibble.launcher import check_devices, check_model_and_task, effective_config, replaced_directories
    from nibble.rundir import RunRecord, State, choose, inspect, locked
    from nibble.trainer.backend import check_backend

    found = choose(out, resume=resume, new=new)
    out = found.path
    record = RunRecord.read(out)
    loaded, overrides = run_config(config, record, found)
    if found.state is State.FINISHED and loaded.trainer.total_steps <= found.steps:
        typer.echo(f"{found.describe()}: nothing to resume, left untouched ({out / 'summary.json'})")
        return
    check_backend(loaded.trainer.backend, loaded.trainer.device)  # refusals come before anything starts
    check_devices(loaded)
    check_model_and_task(loaded)
    effective_config(loaded, out, loaded.redis.url)  # the run folder's directories must keep the config valid
    if prometheus:
        _require_prometheus()
    with locked(out):
        if inspect(out).state is not found.state:  # another launch wrote it between the look and the lock
            raise ValueError(f"--out {out}: changed while this run was starting; run the command again")
        values = loaded.model_dump(mode="json")
        for key, variable in sorted(overrides.by_key.items()):
            typer.echo(f"{variable} sets {key} = {_value_at(values, key)}")
        for line in replaced_directories(loaded, out):
            typer.echo(f"note: {line}")
        if found.state is State.FINISHED:
            typer.echo(f"extending the finished run in {out} from {found.steps} to {loaded.trainer.total_steps} steps")
        elif found.state is State.UNFINISHED:
            typer.echo(f"resuming the run in {out} after step {found.steps}")
        else:
            typer.echo(f"new run in {out}")
        warm_start_seconds = _ensure_warm_start(loaded, _console())
        record.config = loaded.model_dump(mode="json")
        record.begin(out, found.steps, warm_start_seconds)
        code = _launch(loaded, out, redis_url, record, prometheus)
    raise typer.Exit(code)


def _value_at(values: dict, key: str):
    for part in key.split("."):
        values = values[part]
    return values


def _launch(config, out: Path, redis_url: str | None, record, prometheus: bool) -> int:
    """Run the services; record how the segment ended, write the summary and plots, print them; the exit code."""
    from nibble.cli.progress import Progress
    from nibble.launcher import Interrupted, launch

    total = config.trainer.total_steps
    first = record.segments[-1].first_step
    status, code, detail = "finished", 0, ""
    with Progress("training", total - first, unit="steps", console=_console(), every_seconds=float("inf")) as bar:
        printer = _step_printer(bar, total, out / "metrics.jsonl")
        try:
            launch(
                config,
                out,
                redis_url=redis_url,
                on_progress=printer,
                on_stop=bar.print,
                prometheus=prometheus,
                announce=lambda url: bar.print(f"prometheus: {url} (TSDB in {out / 'prometheus'})"),
            )
        except Interrupted as exc:
            status, code = "stopped", exc.exit_code
        except RuntimeError as exc:  # a service failed; the message names it and its log
            typer.echo(f"error: {exc}", err=True)
            status, code, detail = "failed", 1, str(exc)
        printer(out)  # the steps recorded while the services stopped
    record.close(out, status, detail)
    _report(config, out, record)
    if prometheus:
        typer.echo(f"dashboard panels as PNG: nibble report run {out}")
    return code


def _report(config, out: Path, record) -> None:
    """``summary.json`` and the human summary first (the seconds matplotlib takes come last), then the plots."""
    from nibble.analysis.run_report import describe, plot, summarize

    summary = summarize(out, config, record.segments)
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out / "summary.json")
    for line in describe(summary):
        typer.echo(line)
    typer.echo(f"summary: {out / 'summary.json'} (metrics.jsonl, plots and logs/ beside it)")
    if summary["status"] != "finished":
        typer.echo(f"continue with: nibble run --out {out} --resume")
    plot(out)


def _step_printer(bar, total: int, path: Path):
    """The launcher's progress callback: a line per trainer step that ``path`` (``metrics.jsonl``) gains from
    now on (a resumed run's earlier steps are not printed again), and the bar."""
    offset = {"bytes": path.stat().st_size if path.is_file() else 0}

    def progress(_run_dir: Path) -> None:
        if not path.is_file():
            return
        with path.open("rb") as handle:  # only what the trainer appended since the last look
            handle.seek(offset["bytes"])
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        offset["bytes"] += len(complete)
        for text in complete.decode(errors="replace").splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue  # the tail of a line a killed trainer left unfinished
            if line["step"] == 0:
                bar.print(
                    f"RL starts from held-out accuracy {line['eval_accuracy']:.3f} "
                    "(the warm start evaluated by the trainer, under the run's precision plan)"
                )
                continue
            bar.advance()
            acc = line.get("eval_accuracy")
            bar.print(
                f"step {line['step']:4d}/{total}  reward {line['reward_mean']:.3f}  "
                f"eval {'-' if acc is None else f'{acc:.3f}'}  |Δlogprob| {line['logprob_abs_diff']:.4f}  "
                f"staleness {line['staleness_mean']:.2f}  version {line['policy_version']}  ETA {bar.eta()}"
            )

    return progress


def _require_prometheus() -> None:
    from nibble.monitoring.prometheus import binary

    try:
        binary()
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _console():
    from rich.console import Console

    return Console()


def _ensure_warm_start(config, console) -> float:
    """Train the SFT warm start when the config's checkpoint does not exist yet (with a progress bar; the
    seconds it took are returned); warn when an existing one was trained (by ``nibble sft``) on another task
    than the run's."""
    checkpoint = config.model.checkpoint
    if (checkpoint / "config.json").is_file():
        _warn_on_other_task(config, checkpoint, console)
        return 0.0
    import torch

    from nibble.cli.sft import train_with_progress
    from nibble.tasks import get_task
    from nibble.warmstart.sft import save_warm_start

    m = config.model
    typer.echo(
        f"no warm start at {checkpoint}: training one (nibble sft) until held-out accuracy ≥ "
        f"{m.sft_target_accuracy}, at most {m.sft_steps} steps"
    )
    started = time.monotonic()
    torch.set_num_threads(m.sft_threads)
    try:
        with get_task(config.task.name, **config.task.options) as task:
            model, result = train_with_progress(
                task, steps=m.sft_steps, target_accuracy=m.sft_target_accuracy, seed=config.seed
            )
            save_warm_start(model, result, {"name": config.task.name, "options": config.task.options}, checkpoint)
    except KeyboardInterrupt:
        typer.echo("interrupted during the warm start: nothing was saved (the next nibble run trains it again)")
        raise typer.Exit(130) from None
    typer.echo(
        f"warm start: {result.steps} steps, held-out accuracy {result.eval_accuracy:.3f} "
        f"(in bf16, as trained) -> {checkpoint}"
    )
    return time.monotonic() - started


def _warn_on_other_task(config, checkpoint: Path, console) -> None:
    from nibble.warmstart.sft import SFT_RECORD

    record = checkpoint / SFT_RECORD
    if not record.is_file():
        return  # not made by `nibble sft` (an imported model): nothing to compare
    trained = json.loads(record.read_text()).get("task")
    wanted = {"name": config.task.name, "options": config.task.options}
    if trained != wanted:
        console.print(
            f"[yellow]warning:[/] the warm start at {checkpoint} was trained on task {trained}, this run's task is "
            f"{wanted}; remove it to have a matching one trained, or set model.checkpoint",
            soft_wrap=True,
        )
