"""The typer application and the error boundary shared by all sub-commands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import TypeVar

import typer

app = typer.Typer(
    name="nibble",
    help="Nibble: asynchronous RL for language models with NVFP4 rollouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable)


@app.callback()
def root() -> None:
    """Nibble: asynchronous RL for language models with NVFP4 rollouts."""


def user_errors(func: F) -> F:
    """Turn the library's ``ValueError`` (bad input, always with a message naming it) into exit code 2."""

    @wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def main() -> None:
    """Console-script entry point."""
    from nibble.cli import (  # noqa: F401  (each registers a sub-command)
        check_contract,
        checkpoint,
        deadletter,
        health,
        import_model,
        mismatch,
        quant_error,
        report,
        run,
        sft,
        simulate,
        weightsync,
    )

    app(prog_name="nibble")
    sys.exit(0)
