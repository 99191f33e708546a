"""``NIBBLE_*`` environment overrides of the run configuration: each variable applies, or fails naming itself.

``NIBBLE_TRAINER__LEARNING_RATE=1e-4`` sets ``trainer.learning_rate`` (sections and fields joined by
``__``, values parsed as YAML scalars or flow mappings). A variable whose section or field does not exist
is an error naming the variable (with the closest real name), never silently ignored; so is a value the
field refuses. Only the few ``NIBBLE_*`` names that are not config keys (:data:`NOT_CONFIG`: secrets the
services read themselves, and the test suite's switch) are left alone.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel

PREFIX = "NIBBLE_"
NOT_CONFIG = frozenset(
    {
        "NIBBLE_PUBLISH_TOKEN",  # bearer tokens and the Redis password: secrets, read by the services
        "NIBBLE_FETCH_TOKEN",
        "NIBBLE_REDIS_PASSWORD",
        "NIBBLE_TEST_WARM_START",  # the test suite's reuse of a warm start (tests/conftest.py)
    }
)


@dataclass
class Overrides:
    """Which config keys the environment set: dotted key (``trainer.learning_rate``) → variable name."""

    by_key: dict[str, str] = field(default_factory=dict)

    def variable_for(self, location: tuple) -> str | None:
        """The variable that set ``location`` (a pydantic error location) or a section above it."""
        parts = [str(p) for p in location]
        for end in range(len(parts), 0, -1):
            name = self.by_key.get(".".join(parts[:end]))
            if name is not None:
                return name
        return None


def apply(data: dict[str, Any], environ: Mapping[str, str], model: type[BaseModel]) -> Overrides:
    """Merge every config variable of ``environ`` into ``data`` (a YAML mapping validated by ``model``).

    Raises:
        ValueError: naming the variable, for a section or field ``model`` does not have (with the
            closest real name), a value that is not YAML, or a path through a field that is not a section.
    """
    overrides = Overrides()
    for name, raw in sorted(environ.items()):
        if not name.upper().startswith(PREFIX) or name.upper() in NOT_CONFIG:
            continue
        path = name[len(PREFIX) :].lower().split("__")
        _check_path(name, path, model)
        target = data
        for part in path[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ValueError(f"{name}: {part} is not a section in the config file")
        try:
            target[path[-1]] = yaml.safe_load(raw) if raw else raw
        except yaml.YAMLError as exc:
            raise ValueError(f"{name}={raw!r}: not a YAML value ({exc.problem or exc})") from None
        overrides.by_key[".".join(path)] = name
    return overrides


def _check_path(name: str, path: list[str], model: type[BaseModel]) -> None:
    """Walk ``path`` through ``model``'s fields; free-form mappings (``task.options``) accept any key below."""
    where: list[str] = []
    current: type[BaseModel] | None = model
    for index, part in enumerate(path):
        if current is None:
            return  # inside a dict-valued field: its keys are the task's, checked by the task
        fields = current.model_fields
        if not part or part not in fields:
            section = ".".join(where) or "the config"
            close = difflib.get_close_matches(part, fields, n=1)
            hint = f" (did you mean {_variable([*where, close[0]])}?)" if close else ""
            known = ", ".join(fields)
            raise ValueError(f"{name}: {section} has no setting {part!r}{hint}; its settings: {known}")
        annotation = fields[part].annotation
        where.append(part)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            current = annotation
        elif index < len(path) - 1 and not _is_mapping(annotation):
            raise ValueError(f"{name}: {'.'.join(where)} is a value, not a section (use {_variable(where)})")
        else:
            current = None


def _is_mapping(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", annotation) is dict


def _variable(path: list[str]) -> str:
    return PREFIX + "__".join(p.upper() for p in path)
