"""Writing a checkpoint directory without losing what is stored: an output is refused when it holds
something other than a checkpoint (or the source being read), the new directory is filled beside it,
and an old checkpoint is set aside until the new one is in place. Used by ``nibble import-model``,
``nibble import-checkpoint`` / ``export-checkpoint`` and weight-sync's exports."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def check_output(out: Path, *, overwrite: bool, source: Path | None = None) -> None:
    """Refuse ``out`` before any (possibly minutes-long) work: not empty without ``overwrite``; with it,
    anything but a checkpoint (a folder with ``config.json``); the source or a folder holding it; a path
    that is a file or a link; a place that cannot be written.

    Raises:
        ValueError: naming ``out`` and the reason.
    """
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"{out}: exists and is not a directory; choose another --out")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ValueError(f"{out}: already exists and is not empty (pass --overwrite to replace it)")
        if not (out / "config.json").is_file():
            raise ValueError(f"{out}: --overwrite replaces a model checkpoint only, and this holds no config.json")
    if source is not None:
        resolved = out.resolve()
        if resolved == source.resolve() or resolved in source.resolve().parents:
            raise ValueError(f"{out}: the output must not be the source or a folder holding it ({source})")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)).rmdir()
    except OSError as exc:
        raise ValueError(f"{out}: cannot write beside it ({exc.strerror or exc})") from None


def write_directory(out: Path, fill: Callable[[Path], None]) -> None:
    """Run ``fill`` on an empty folder beside ``out``, make its files readable by every user (a pod's user
    is rarely the writer; safetensors writes 0600), then move it to ``out``: ``out`` is complete or as it
    was. An existing ``out`` is removed only once the new one is in place."""
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        fill(staging)
        for path in (staging, *staging.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        if not out.exists():
            staging.rename(out)
            return
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        old.rmdir()
        out.rename(old)
        try:
            staging.rename(out)
        except BaseException:
            old.rename(out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
