"""The measured numbers behind the simulator, and replacing them with ones Nibble measured.

A :class:`Calibration` holds the precision floors, rollout and train seconds per step and the weight-sync
pause per format, each with a note of where it came from. :func:`published` gives the article's numbers
(docs/design.md §7); :func:`load` overrides them from files, in order (a later file wins for the same number).
:mod:`nibble.simulator.calibration_files` reads the accepted files (README.md "Calibration" documents them).

Every floor is a *measurement* under a plan (the article's unless said otherwise): it is converted to the
format's table floor by inverting the whole model of :func:`nibble.simulator.drift_model.precision_floor` (the plan
factor, and for NVFP4 without four-over-six its +0.008), so that the model gives back exactly the
measurement for the measured plan. The conversion uses the final BF16 floor, whichever file set it.

The model's floors are BF16's plus a non-negative format term, so no format's table floor can lie below
BF16's. A table floor that would (a measurement below the BF16 floor, e.g. a small model's against the
published 0.0103, or NVFP4 without 4/6 measured below BF16's + 0.008) is *clamped* to the BF16 floor, and
its source says so. Floors above 1 nat per token, and step times above :data:`MAX_STEP_SECONDS`, are
rejected as not measurements of this kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nibble.simulator.calibration_files import (
    ARTICLE_PLAN,
    MAX_FLOOR,
    MAX_STEP_SECONDS,
    MISMATCH_FILE,
    SUMMARY_FILE,
    is_real,
    read_mismatch,
    read_summary,
)
from nibble.simulator.drift_model import (
    FORMAT_KEYS,
    PUBLISHED_FLOORS,
    PUBLISHED_ROLLOUT_SECONDS,
    PUBLISHED_TRAIN_SECONDS,
    TRAIN_KEYS,
    format_floor_from_measurement,
    plan_floor_factor,
)

PUBLISHED_SOURCE = "published: The 4-Bitter Lesson (humans&, 2026), Qwen3-30B-A3B"
# Not a measurement: slime's 48 s for a 355B model over NCCL (docs/design.md §8) scaled by size to a 30B model.
WEIGHT_SYNC_SECONDS = 5.0
WEIGHT_SYNC_SOURCE = "illustrative: 48 s for 355B over NCCL (slime) scaled to 30B"
# Sources of the numbers no file replaced.
DEFAULT_SOURCES = (PUBLISHED_SOURCE, WEIGHT_SYNC_SOURCE)
# The largest table floor a measurement up to MAX_FLOOR converts to (the smallest plan factor is 0.8).
MAX_TABLE_FLOOR = MAX_FLOOR / plan_floor_factor(True, True)


@dataclass(frozen=True)
class Calibration:
    """Measured inputs of the model. Units: floors in nats per token, times in seconds per train step
    (the weight-sync pause: seconds per swap, per sampler).

    ``floors`` are *table* floors (``f_format`` of :func:`nibble.simulator.drift_model.precision_floor`): each at least
    the BF16 floor, at least 0 and at most :data:`MAX_TABLE_FLOOR`. ``weight_sync_seconds`` is per format key,
    as ``rollout_seconds`` is: publishing and quantising NVFP4 weights is not BF16's cost. Checked on
    construction (:class:`ValueError` naming the table and key).
    """

    floors: dict[str, float]  # keys: FORMAT_KEYS
    rollout_seconds: dict[str, float]  # keys: FORMAT_KEYS
    train_seconds: dict[str, float]  # keys: TRAIN_KEYS
    weight_sync_seconds: dict[str, float]  # keys: FORMAT_KEYS
    sources: dict[str, str] = field(default_factory=dict)  # "floors.nvfp4" → where the number came from

    def __post_init__(self) -> None:
        for name, table, keys in (
            ("floors", self.floors, FORMAT_KEYS),
            ("rollout", self.rollout_seconds, FORMAT_KEYS),
            ("train", self.train_seconds, TRAIN_KEYS),
            ("weight_sync", self.weight_sync_seconds, FORMAT_KEYS),
        ):
            if set(table) != set(keys):
                raise ValueError(f"calibration {name} must have the keys {', '.join(keys)}, got {sorted(table)}")
        for key in FORMAT_KEYS:
            value = self.floors[key]
            if not is_real(value) or not 0 <= value <= MAX_TABLE_FLOOR:
                raise ValueError(f"floors.{key}={value!r} must lie in [0, {MAX_TABLE_FLOOR:g}] nats per token")
            if value < self.floors["bf16"]:
                raise ValueError(
                    f"floors.{key}={value!r} is below floors.bf16={self.floors['bf16']!r}: the model's floors are "
                    "BF16's plus a non-negative format term"
                )
        seconds = [(f"rollout.{k}", v) for k, v in self.rollout_seconds.items()]
        seconds += [(f"train.{k}", v) for k, v in self.train_seconds.items()]
        seconds += [(f"weight_sync.{k}", v) for k, v in self.weight_sync_seconds.items()]
        for name, value in seconds:
            if not is_real(value) or not 0 < value <= MAX_STEP_SECONDS:
                raise ValueError(f"{name}={value!r} must be a number of seconds in (0, {MAX_STEP_SECONDS:g}]")

    def rows(self) -> list[tuple[str, float, str]]:
        """``(name, value, source)`` for every number, in a fixed order."""
        out = [(f"floors.{k}", self.floors[k], self.sources[f"floors.{k}"]) for k in FORMAT_KEYS]
        for table, keys in (("rollout", FORMAT_KEYS), ("train", TRAIN_KEYS), ("weight_sync", FORMAT_KEYS)):
            out += [(f"{table}.{k}", self.seconds(f"{table}.{k}"), self.sources[f"{table}.{k}"]) for k in keys]
        return out

    def seconds(self, name: str) -> float:
        """The seconds named ``rollout.<key>``, ``train.<key>`` or ``weight_sync.<key>`` (a key of ``sources``).

        Raises:
            KeyError: for any other name (a bug: names come from the key functions of ``drift_model``).
        """
        table, _, key = name.partition(".")
        tables = {"rollout": self.rollout_seconds, "train": self.train_seconds, "weight_sync": self.weight_sync_seconds}
        return tables[table][key]

    def as_dict(self) -> dict:
        return {
            "floors": dict(self.floors),
            "rollout_seconds": dict(self.rollout_seconds),
            "train_seconds": dict(self.train_seconds),
            "weight_sync_seconds": dict(self.weight_sync_seconds),
            "sources": dict(self.sources),
        }


def published() -> Calibration:
    """The article's floors and step times, and the illustrative weight-sync pause (the same for every format)."""
    sources = {f"floors.{k}": PUBLISHED_SOURCE for k in FORMAT_KEYS}
    sources |= {f"rollout.{k}": PUBLISHED_SOURCE for k in FORMAT_KEYS}
    sources |= {f"train.{k}": PUBLISHED_SOURCE for k in TRAIN_KEYS}
    sources |= {f"weight_sync.{k}": WEIGHT_SYNC_SOURCE for k in FORMAT_KEYS}
    return Calibration(
        floors=dict(PUBLISHED_FLOORS),
        rollout_seconds=dict(PUBLISHED_ROLLOUT_SECONDS),
        train_seconds=dict(PUBLISHED_TRAIN_SECONDS),
        weight_sync_seconds=dict.fromkeys(FORMAT_KEYS, WEIGHT_SYNC_SECONDS),
        sources=sources,
    )


def load(paths: list[Path], base: Calibration | None = None) -> Calibration:
    """``base`` (default :func:`published`) with numbers replaced from each path in turn.

    A path is a mismatch file (any of the three shapes of :mod:`nibble.simulator.calibration_files`), a stability
    grid's results file (step times only: :mod:`nibble.simulator.stability_calibration`), or a run directory
    holding ``summary.json`` (and optionally a ``mismatch.json`` beside it, read first). Measured floors
    are converted to table floors at the end, against the final BF16 floor, and clamped to it from below.

    Raises:
        ValueError: naming the file and the field, for a missing path, invalid JSON, an unknown key, a
            value that is not a number in its range (floors: 0 to 1 nat per token; seconds: positive, at
            most :data:`MAX_STEP_SECONDS`) or not one of the allowed words, or (as :class:`NothingToCalibrate`)
            a file that holds no number to calibrate from.
    """
    updates = Updates(published() if base is None else base)
    for path in paths:
        path = Path(path)
        if path.is_dir():
            if (path / MISMATCH_FILE).is_file():
                read_mismatch(updates, path / MISMATCH_FILE)
            if not (path / SUMMARY_FILE).is_file():
                raise ValueError(f"{path}: a run directory must hold {SUMMARY_FILE}")
            read_summary(updates, path / SUMMARY_FILE)
        elif path.is_file():
            read_mismatch(updates, path)
        else:
            raise ValueError(f"{path}: no such file or directory")
    return updates.build()


class NothingToCalibrate(ValueError):
    """A well-formed file that holds no number the simulator takes (a report can go on without it)."""


@dataclass(frozen=True)
class _Measured:
    """A floor as measured: under ``plan``, before conversion to the table floor."""

    value: float
    plan: dict[str, bool]
    source: str


class Updates:
    """Numbers read from the files so far, with their sources; floors are converted in :meth:`build`."""

    def __init__(self, base: Calibration) -> None:
        self.base = base
        self.floors: dict[str, _Measured] = {}
        self.rollout = dict(base.rollout_seconds)
        self.train = dict(base.train_seconds)
        self.weight_sync = dict(base.weight_sync_seconds)
        self.sources = dict(base.sources)
        self.count = 0  # numbers read from the current file

    def start(self) -> None:
        self.count = 0

    def set(self, table: dict, name: str, key: str, value: float, source: str) -> None:
        table[key] = value
        self.sources[name] = source
        self.count += 1

    def floor(self, key: str, measured: float, plan: dict[str, bool], source: str) -> None:
        self.floors[key] = _Measured(measured, dict(plan), source)
        self.count += 1

    def finish(self, path: Path, what: str = "floors, step times") -> None:
        """Raises :class:`NothingToCalibrate` when the current file set no number (``what``: what it lacks)."""
        if not self.count:
            raise NothingToCalibrate(f"{path}: holds no number to calibrate from ({what})")

    def build(self) -> Calibration:
        floors, sources = {}, dict(self.sources)
        if "bf16" in self.floors:
            bf16 = self.floors["bf16"].value
            sources["floors.bf16"] = self.floors["bf16"].source
        else:
            bf16 = self.base.floors["bf16"]
        floors["bf16"] = bf16
        for key in FORMAT_KEYS[1:]:
            if key in self.floors:
                measured = self.floors[key]
                table = format_floor_from_measurement(measured.value, key=key, bf16_floor=bf16, **measured.plan)
                note = measured.source
                if measured.plan != ARTICLE_PLAN or key == "nvfp4":
                    note += (
                        f" (measured under bf16_last_15={measured.plan['bf16_last_15']}, "
                        f"bf16_shared_experts={measured.plan['bf16_shared_experts']}; converted to the table floor"
                        + (", the model's +0.008 for NVFP4 without 4/6 taken off" if key == "nvfp4" else "")
                        + ")"
                    )
            else:
                table, note = self.base.floors[key], self.base.sources[f"floors.{key}"]
            if table < bf16:
                note += (
                    f"; clamped from {table:.4g} to floors.bf16 = {bf16:.4g}: the model's floors are BF16's plus a "
                    "non-negative format term"
                )
                table = bf16
            floors[key] = table
            sources[f"floors.{key}"] = note
        return Calibration(floors, self.rollout, self.train, self.weight_sync, sources)
