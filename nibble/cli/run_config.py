"""The config of one ``nibble run`` launch: a new run's from ``--config`` and the environment; a resumed
run's from its record (``run.json``), which ``--config`` and ``NIBBLE_*`` variables may only repeat — a run
keeps one config across its segments — except ``trainer.total_steps``, which may grow to extend it."""

from __future__ import annotations

import copy
from pathlib import Path

from nibble.config import RunConfig, load_with_overrides
from nibble.config.env import Overrides
from nibble.rundir import Found, RunRecord, State

EXTENSIBLE = "trainer.total_steps"


def run_config(path: Path | None, record: RunRecord, found: Found) -> tuple[RunConfig, Overrides]:
    """This launch's config and the keys the environment set.

    Raises:
        ValueError: a bad config or variable (naming it), or a resume whose config differs from the run's
            (naming each key, its two values and the variable that set it), or whose
            ``trainer.total_steps`` is below the steps already done.
    """
    if found.state is State.EMPTY or record.config is None:
        return load_with_overrides(path)
    recorded = found.path / "run.json"
    base = None if path is not None else copy.deepcopy(record.config)
    config, overrides = load_with_overrides(path if path is not None else recorded, data=base)
    changed = differences(record.config, config.model_dump(mode="json"))
    changed.pop(EXTENSIBLE, None)
    if changed:
        described = []
        for key, (was, now) in sorted(changed.items()):
            variable = overrides.by_key.get(key)
            described.append(f"{key} {was!r} → {now!r}" + (f" (set by {variable})" if variable else ""))
        raise ValueError(
            f"--resume: the config differs from the run's ({recorded}) in {'; '.join(described)}. A resumed run "
            f"keeps its config (only {EXTENSIBLE} may grow); --new starts a new run with this one"
        )
    if config.trainer.total_steps < found.steps:
        raise ValueError(
            f"--resume: trainer.total_steps={config.trainer.total_steps} is below the {found.steps} steps the run "
            f"in {found.path} has done"
        )
    return config, overrides


def differences(before: dict, after: dict, prefix: str = "") -> dict[str, tuple]:
    """Dotted keys whose values differ between two config mappings, with both values."""
    found = {}
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            found.update(differences(a, b, f"{name}."))
        elif a != b:
            found[name] = (a, b)
    return found
