"""``nibble sft``: the supervised warm start RL begins from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors

PATH_OPTIONS = ("path", "tokenizer")


def parse_options(pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs to a dict; values parse as JSON when they can (numbers, booleans), else text.
    File options (``path``, ``tokenizer``) are made absolute, so the recorded task works from anywhere."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--task-option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
        if key in PATH_OPTIONS:
            options[key] = str(Path(value).expanduser().resolve())
    return options


def writable_directory(out: Path) -> None:
    """Refuse a non-empty directory (nothing stored is overwritten) or one that cannot be created."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out}: exists and is not an empty directory (refusing to overwrite)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror or exc})") from exc


@app.command("sft")
@user_errors
def sft(
    out: Annotated[Path, typer.Option(help="directory for the HF-format checkpoint and nibble_sft.json")],
    task: Annotated[str, typer.Option(help="task name: addition | jsonl")] = "addition",
    task_option: Annotated[
        list[str] | None, typer.Option(help="task option KEY=VALUE, repeatable (e.g. digits=3, path=data.jsonl)")
    ] = None,
    steps: Annotated[int, typer.Option(help="optimiser step budget")] = 1000,
    batch_size: Annotated[int, typer.Option(help="sequences per step")] = 64,
    learning_rate: Annotated[float, typer.Option(help="AdamW learning rate")] = 3e-3,
    target_accuracy: Annotated[float, typer.Option(help="stop at the first evaluation reaching this")] = 0.3,
    eval_every: Annotated[int, typer.Option(help="steps between held-out evaluations")] = 10,
    seed: Annotated[int, typer.Option(help="seed of model init and data order")] = 0,
    threads: Annotated[
        int, typer.Option(min=1, help="torch threads (more than the idle cores slows training down many times)")
    ] = 1,
) -> None:
    """Train the tiny MoE with teacher forcing on a task's answers until held-out accuracy reaches a target."""
    options = parse_options(task_option or [])
    import torch

    from nibble.tasks import get_task
    from nibble.warmstart.sft import save_warm_start

    torch.set_num_threads(threads)

    writable_directory(out)
    with get_task(task, **options) as chosen:
        model, result = train_with_progress(
            chosen,
            steps=steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
            target_accuracy=target_accuracy,
            eval_every=eval_every,
            seed=seed,
        )
        save_warm_start(model, result, {"name": task, "options": options}, out)
    typer.echo(f"warm start: {result.steps} steps, held-out accuracy {result.eval_accuracy:.3f} -> {out}")


def train_with_progress(task, *, steps: int, **options):
    """``nibble.warmstart.sft.train_sft`` with a progress bar over the step budget (an ETA to the budget: reaching
    ``target_accuracy`` stops it sooner) and a line per held-out evaluation."""
    from nibble.cli.progress import Progress
    from nibble.warmstart.sft import train_sft

    target = options.get("target_accuracy")
    until = f" (stops at held-out accuracy ≥ {target})" if target else ""
    with Progress(f"warm start{until}", steps, unit="steps") as bar:

        def progress(step: int, loss: float, evaluated: float | None) -> None:
            bar.advance(note=f"loss {loss:.3f}")
            if evaluated is not None:
                bar.print(f"warm start step {step:5d}  loss {loss:.4f}  held-out accuracy {evaluated:.3f}")

        return train_sft(task, steps=steps, progress=progress, **options)
