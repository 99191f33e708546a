"""The ``nibble`` command line: one sub-command module per job, registered on one typer app.

Sub-commands import torch and the library lazily, inside the command, so ``--help`` and argument
errors answer without paying for heavy imports.
"""

from nibble.cli.app import app, main

__all__ = ["app", "main"]
