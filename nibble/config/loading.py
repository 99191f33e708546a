"""A run's configuration from a YAML file and ``NIBBLE_*`` environment overrides, with errors naming the key."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nibble.config import env as config_env
from nibble.config.run import RunConfig


def load(path: Path | None, environ: Mapping[str, str] | None = None) -> RunConfig:
    """Read ``path`` (YAML; ``None`` = all defaults), apply ``NIBBLE_*`` overrides, validate.

    Raises:
        ValueError: naming the file and the key — or the environment variable, for a value it set — for an
            unreadable/invalid YAML file, an unknown key or variable, a wrong type or value, or settings
            that cannot make progress.
    """
    return load_with_overrides(path, environ)[0]


def load_with_overrides(
    path: Path | None, environ: Mapping[str, str] | None = None, data: dict[str, Any] | None = None
) -> tuple[RunConfig, config_env.Overrides]:
    """:func:`load`, also returning which keys the environment set; with ``data``, that mapping (already
    read from ``path``, e.g. a run's recorded config) instead of the file's contents.

    Raises:
        ValueError: as :func:`load`.
    """
    if data is None:
        data = _read(path)
    overrides = config_env.apply(data, os.environ if environ is None else environ, RunConfig)
    try:
        return RunConfig.model_validate(data), overrides
    except ValidationError as exc:
        raise ValueError(_describe(exc, path, overrides)) from None


def _read(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of sections")
    return data


def _describe(exc: ValidationError, path: Path | None, overrides: config_env.Overrides) -> str:
    """One line per problem, blaming the environment variable that set the value when one did."""
    source = str(path) if path is not None else "config"
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        variable = overrides.variable_for(error["loc"]) if error["loc"] else None
        if variable is not None:
            lines.append(f"{variable}: {where}: {error['msg']}")
        elif where:
            lines.append(f"{source}: {where}: {error['msg']}")
        else:  # a cross-field check: the file and every variable may have a part in it
            also = f" with {', '.join(sorted(overrides.by_key.values()))}" if overrides.by_key else ""
            lines.append(f"{source}{also}: {error['msg']}")
    return "; ".join(lines)
