"""Which folder a ``nibble run`` may write, and what a run folder already holds.

A finished run's record is never rewritten: ``nibble run`` into a folder that holds a run (finished or
not) refuses unless the user says what they want — ``--resume`` continues the run there (a finished one
is left alone, unless ``trainer.total_steps`` was raised to extend it), ``--new`` starts a fresh run in
the next free folder beside it (``DIR-2``, ``DIR-3``, …). One launcher at a time holds a folder's lock.
"""

from __future__ import annotations

import enum
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nibble.rundir.segments import RECORD, RunRecord, last_step

LOCK = ".nibble-run.lock"
SUMMARY = "summary.json"
RUN_FILES = ("metrics.jsonl", "trainer", "config.yaml", RECORD)
"""What the launcher and the trainer leave in a run folder (any of them marks one)."""


class State(enum.Enum):
    EMPTY = "empty"
    FINISHED = "finished"
    UNFINISHED = "unfinished"
    OTHER = "other"  # files that no run left: never written into


@dataclass(frozen=True)
class Found:
    """A run folder's state; ``steps`` is the last step the trainer recorded, ``total_steps`` the run's target
    (``None`` when nothing says)."""

    path: Path
    state: State
    steps: int = 0
    total_steps: int | None = None

    def describe(self) -> str:
        target = f"/{self.total_steps}" if self.total_steps else ""
        return f"{self.path} holds {'a finished' if self.state is State.FINISHED else 'an unfinished'} run " + (
            f"(step {self.steps}{target})"
        )


def inspect(path: Path) -> Found:
    """What ``path`` holds (it need not exist)."""
    path = Path(path)
    if not path.exists() or (path.is_dir() and not any(p.name != LOCK for p in path.iterdir())):
        return Found(path, State.EMPTY)
    if not path.is_dir() or not any((path / name).exists() for name in (*RUN_FILES, SUMMARY)):
        return Found(path, State.OTHER)
    record = RunRecord.read(path)
    steps = last_step(path)
    total = (record.config or {}).get("trainer", {}).get("total_steps")
    if record.segments:
        finished = record.segments[-1].status == "finished"
    else:  # written before run records existed: the launcher wrote summary.json only when the run finished
        finished = (path / SUMMARY).is_file()
    return Found(path, State.FINISHED if finished else State.UNFINISHED, steps, total)


def next_free(path: Path) -> Path:
    """``path`` itself when empty, else the first of ``path-2``, ``path-3``, … that is missing or empty."""
    path = Path(path)
    candidate, n = path, 1
    while inspect(candidate).state is not State.EMPTY:
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def choose(out: Path, *, resume: bool, new: bool) -> Found:
    """The folder this launch writes, by the rules of the module docstring.

    Raises:
        ValueError: (the CLI's exit 2) naming the folder, what it holds and the options: a run there
            without ``--resume``/``--new``, ``--resume`` with nothing to resume, a folder of other files,
            or both flags.
    """
    if resume and new:
        raise ValueError("--resume continues the run in --out, --new starts another one: choose one")
    found = inspect(out)
    if new:
        return inspect(next_free(out))
    if found.state is State.OTHER:
        raise ValueError(f"--out {out}: holds files that are not a Nibble run; choose another folder")
    if resume:
        if found.state is State.EMPTY:
            raise ValueError(f"--resume: nothing to resume in {out} (no run there); leave out --resume to start one")
        return found
    if found.state is State.EMPTY:
        return found
    fresh = next_free(out)
    if found.state is State.UNFINISHED:
        hint = "--resume continues it, "
    else:
        hint = "--resume with a larger trainer.total_steps extends it, "
    raise ValueError(f"{found.describe()}; left untouched. {hint}--new starts a new run in {fresh}")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``path``'s lock for the block (created if missing).

    Raises:
        ValueError: another live process holds it (another ``nibble run`` is writing the folder).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    handle = (path / LOCK).open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            raise ValueError(f"--out {path}: another nibble run ({owner}) is writing this folder") from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield
    finally:
        handle.close()
