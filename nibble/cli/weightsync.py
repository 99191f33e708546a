"""``nibble weightsync``: run the weight-sync service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app


@app.command("weightsync")
def weightsync(
    config: Annotated[Path | None, typer.Option(help="run configuration (YAML); only `weightsync` is read")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ...")] = "INFO",
) -> None:
    """Serve weight publication (trainer) and fetching (samplers) until SIGTERM."""
    from nibble.weightsync.main import main

    argv = ["--log-level", log_level] + (["--config", str(config)] if config is not None else [])
    raise typer.Exit(main(argv))
