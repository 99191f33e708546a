"""Trainer checkpoints: model, optimiser state, the trained-trajectory ledger and counters.

Everything is safetensors or JSON (nothing pickled), except a sharded trainer's model and optimiser,
which ``torch.distributed.checkpoint`` writes under ``sharded/`` (one file per rank, loadable with any
number of ranks). A checkpoint is written to a temporary directory and renamed into place, so a crash
leaves either the previous checkpoint or the new one, never half.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from nibble.model import MoETransformer
from nibble.trainer.parallel import OPTIMIZER_FILE, SHARDED_DIR, SINGLE_PROCESS, Parallelism

STATE_FILE = "trainer_state.json"

log = logging.getLogger("nibble.trainer")


class Ledger:
    """The last ``capacity`` trained trajectory ids, in training order (a bounded, ordered set)."""

    def __init__(self, capacity: int, ids: list[str] | None = None):
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict.fromkeys(ids or [])

    def __contains__(self, trajectory_id: str) -> bool:
        return trajectory_id in self._ids

    def add(self, trajectory_id: str) -> None:
        self._ids[trajectory_id] = None
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def ids(self) -> list[str]:
        return list(self._ids)


@dataclass
class TrainerState:
    """Counters that must survive a restart."""

    step: int = 0
    policy_version: int = 0
    trained: list[str] = field(default_factory=list)
    stale_dropped: list[str] = field(default_factory=list)
    eval_accuracy: float | None = None
    # of the process that wrote the checkpoint (nibble.rundir.provenance)
    provenance: dict = field(default_factory=dict)


def save(
    directory: Path,
    model: MoETransformer,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    keep: int = 2,
    parallel: Parallelism = SINGLE_PROCESS,
) -> Path:
    """Write checkpoint ``step-<n>`` under ``directory`` atomically, point ``latest`` at it, then delete all
    but the newest ``keep`` checkpoints (a run checkpoints every step: kept, the tiny model's 15 MB each
    filled 7 GB per 450-step run). The one before ``latest`` stays as a fallback.

    Every process of ``parallel`` calls this (a sharded write is collective): each writes its part of model
    and optimiser (:meth:`Parallelism.save_weights`), the leader writes the state and moves the directory
    into place; every process returns once it is there.

    Raises:
        ValueError: ``keep`` < 1.
    """
    if keep < 1:
        raise ValueError(f"keep={keep} must be at least 1 (the checkpoint just written)")
    leader = parallel.leader
    final = directory / f"step-{state.step:08d}"
    tmp = directory / f".tmp-step-{state.step:08d}"
    if leader:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    parallel.save_weights(model, optimizer, tmp)
    if leader:
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state)) + "\n")
        fsync_tree(tmp)  # on disk before the rename makes it the checkpoint (a power cut keeps old or new)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        latest_tmp = directory / ".latest.tmp"
        latest_tmp.write_text(final.name + "\n")
        fsync_tree(latest_tmp)
        os.replace(latest_tmp, directory / "latest")
        fsync_tree(directory, recurse=False)  # the renames themselves
        for old in sorted(directory.glob("step-*"))[:-keep]:  # zero-padded step numbers sort in step order
            shutil.rmtree(old, ignore_errors=True)
    parallel.barrier()
    return final


def save_stale_dropped(path: Path, stale_dropped: list[str]) -> None:
    """Replace the ``stale_dropped`` ledger of checkpoint ``path`` (single-process or sharded: the state is
    one JSON file), atomically, leaving everything else of it as it was.

    Raises:
        ValueError: the checkpoint's state is unreadable.
    """
    state = load_state(path)
    state.stale_dropped = list(stale_dropped)
    file = Path(path) / STATE_FILE
    tmp = file.with_name(f".{STATE_FILE}.tmp")
    tmp.write_text(json.dumps(asdict(state)) + "\n")
    fsync_tree(tmp)
    os.replace(tmp, file)  # a crash leaves the old ledger or the new one, never a torn file
    fsync_tree(file.parent, recurse=False)


def fsync_tree(path: Path, recurse: bool = True) -> None:
    """Flush ``path`` (a file, or a directory with, when ``recurse``, every file and directory below it) to
    the disk, so a rename that follows publishes only durable data."""
    path = Path(path)
    paths = [path] if not recurse or path.is_file() else [*path.rglob("*"), path]
    for item in paths:
        fd = os.open(item, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def is_sharded(path: Path) -> bool:
    """Whether checkpoint ``path`` was written by a sharded (torchrun) trainer."""
    return (Path(path) / SHARDED_DIR).is_dir()


def check_layout(path: Path, *, sharded: bool) -> None:
    """Refuse to resume checkpoint ``path`` with the other kind of trainer (sharded vs single-process).

    Raises:
        ValueError: naming the checkpoint and the setting to change.
    """
    if sharded and not is_sharded(path):
        raise ValueError(
            f"{path}: written by a single-process trainer; resume it with trainer.nproc_per_node=1 "
            "(or start the sharded trainer from a fresh checkpoint_dir)"
        )
    if not sharded and is_sharded(path):
        raise ValueError(f"{path}: written by a sharded trainer; resume it with trainer.nproc_per_node > 1")


def load_weights(
    path: Path, model: MoETransformer, optimizer: torch.optim.Optimizer, parallel: Parallelism = SINGLE_PROCESS
) -> None:
    """Restore checkpoint ``path``'s model and optimiser state written by ``parallel``'s kind of trainer.

    Raises:
        ValueError: ``path`` was written by the other kind of trainer (sharded vs single-process), or its
            files are missing or damaged.
    """
    check_layout(path, sharded=parallel.sharded)
    parallel.load_weights(path, model, optimizer)


def latest(directory: Path) -> Path | None:
    """The checkpoint to resume from: the one ``latest`` points at, or, when that one is incomplete (a
    crash between writes, a damaged disk) or the pointer is missing, the newest complete ``step-*``, with
    a warning naming what was skipped. ``None`` when the directory holds no checkpoint at all.

    Raises:
        ValueError: checkpoints are there but none is complete (starting afresh would rotate them away).
    """
    directory = Path(directory)
    pointer = directory / "latest"
    steps = sorted(directory.glob("step-*"))
    if not pointer.is_file() and not steps:
        return None
    named = directory / pointer.read_text().strip() if pointer.is_file() else None
    if named is not None and is_complete(named):
        return named
    complete = [step for step in steps if is_complete(step)]
    if not complete:
        raise ValueError(
            f"{directory}: no complete checkpoint (each needs {STATE_FILE} and its weights); move the directory "
            "aside to start again from the warm start"
        )
    skipped = named if named is not None else f"{pointer} (missing)"
    log.warning("checkpoint %s is incomplete; resuming from %s", skipped, complete[-1])
    return complete[-1]


def is_complete(path: Path) -> bool:
    """Whether checkpoint ``path`` holds its state and weights (sharded or single-process)."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        return False
    if is_sharded(path):
        return (path / SHARDED_DIR / ".metadata").is_file()
    return (path / OPTIMIZER_FILE).is_file() and any(path.glob("*.safetensors"))


def load_state(path: Path) -> TrainerState:
    """Counters of checkpoint ``path`` (errors name the file)."""
    file = Path(path) / STATE_FILE
    try:
        return TrainerState(**json.loads(file.read_text()))
    except (OSError, json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"{file}: unreadable trainer state ({exc})") from exc
