"""Provenance of a run's outputs: which code, which configuration, which packages, which machine.

Recorded in every checkpoint's ``trainer_state.json`` and in ``nibble run``'s ``summary.json``, so a
result can be traced back (and a resumed run's checkpoints told apart from another run's).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

from nibble.config import RunConfig

PACKAGES = ("nibble", "torch", "triton", "grpcio", "protobuf", "redis", "safetensors", "pydantic")


def git_revision(directory: Path | None = None) -> str | None:
    """The commit checked out where Nibble's source lives (``+dirty`` when files differ from it), or
    ``None`` outside a git work tree (an installed wheel) or without git."""
    directory = directory or Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=directory, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def config_hash(config: RunConfig) -> str:
    """sha256 (hex) of the configuration's canonical JSON: equal for equal settings, however written."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a result depends on (``None``: not installed)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict:
    """Host name, OS, Python, CPU count and, when visible, the CUDA devices."""
    info = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return info


def provenance(config: RunConfig) -> dict:
    """``{git_revision, config_sha256, packages, machine}`` for ``config`` on this machine."""
    return {
        "git_revision": git_revision(),
        "config_sha256": config_hash(config),
        "packages": package_versions(),
        "machine": machine(),
    }
