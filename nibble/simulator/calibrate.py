"""The measured numbers behind the simulator, and replacing them with ones Nibble measured.

A :class:`Calibration` holds the precision floors, rollout and train seconds per step and the weight-sync
pause, each with a note of where it came from. :func:`published` gives the article's numbers
(DESIGN.md §7); :func:`load` overrides them from files, in order (a later file wins for the same number).
Two shapes are accepted — a *mismatch file* (what ``nibble mismatch`` and the stability benchmark write)
and a *run directory* (what ``nibble run`` leaves); README.md "Simulator" documents both::

    mismatch.json = {
      "source": "free text: model, data, date",                         # optional
      "plan": {"bf16_last_15": true, "bf16_shared_experts": false},     # optional; plan the floors were measured under
      "floors": {"bf16": 0.011, "mxfp8": 0.02, "nvfp4": 0.033, "nvfp4_4o6": 0.031},          # any subset
      "step_seconds": {"rollout": {"bf16": 109.4, ...},                                       # any subset
                       "train": {"bf16": 64.3, "nvfp4_dequantized": 70.4, ...}, "weight_sync": 5.0}
    }
    RUN_DIR/summary.json = {
      "precision": "nvfp4", "four_over_six": true, "backward": "dequantized",   # what the run used
      "bf16_last_15": true, "bf16_shared_experts": false,                       # optional plan
      "fresh_logprob_abs_diff_mean": 0.031,   # floor from staleness-0 tokens (preferred), else
      "logprob_abs_diff_mean": 0.034,         # floor from all tokens (includes staleness when max_staleness > 0)
      "max_staleness": 0, "rollout_seconds_per_step": 80.0, "train_seconds_per_step": 66.0,
      "weight_sync_seconds": 4.0              # all optional; other keys of a run summary are ignored
    }

A floor measured under a plan other than the article's (last 15% BF16, no shared experts: the model's
factor 1.6 · 0.625 = 1) is converted to the format's table floor by inverting the model's plan factor, so
that the model reproduces the measurement for the measured plan.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from nibble.stability import (
    BACKWARDS,
    FORMAT_KEYS,
    PRECISIONS,
    PUBLISHED_FLOORS,
    PUBLISHED_ROLLOUT_SECONDS,
    PUBLISHED_TRAIN_SECONDS,
    TRAIN_KEYS,
    format_floor_from_measurement,
    format_key,
    train_key,
)

PUBLISHED_SOURCE = "published: The 4-Bitter Lesson (humans&, 2026), Qwen3-30B-A3B"
# Not a measurement: slime's 48 s for a 355B model over NCCL (DESIGN.md §8) scaled by size to a 30B model.
WEIGHT_SYNC_SECONDS = 5.0
WEIGHT_SYNC_SOURCE = "illustrative: 48 s for 355B over NCCL (slime) scaled to 30B"
# The plan the article's floors were measured under.
ARTICLE_PLAN = {"bf16_last_15": True, "bf16_shared_experts": False}
MISMATCH_FILE = "mismatch.json"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class Calibration:
    """Measured inputs of the model. Units: floors in nats per token, times in seconds per train step."""

    floors: dict[str, float]  # keys: FORMAT_KEYS
    rollout_seconds: dict[str, float]  # keys: FORMAT_KEYS
    train_seconds: dict[str, float]  # keys: TRAIN_KEYS
    weight_sync_seconds: float
    sources: dict[str, str] = field(default_factory=dict)  # "floors.nvfp4" → where the number came from

    def rows(self) -> list[tuple[str, float, str]]:
        """``(name, value, source)`` for every number, in a fixed order."""
        out = [(f"floors.{k}", self.floors[k], self.sources[f"floors.{k}"]) for k in FORMAT_KEYS]
        out += [(f"rollout.{k}", self.rollout_seconds[k], self.sources[f"rollout.{k}"]) for k in FORMAT_KEYS]
        out += [(f"train.{k}", self.train_seconds[k], self.sources[f"train.{k}"]) for k in TRAIN_KEYS]
        out.append(("weight_sync", self.weight_sync_seconds, self.sources["weight_sync"]))
        return out

    def as_dict(self) -> dict:
        return {
            "floors": dict(self.floors),
            "rollout_seconds": dict(self.rollout_seconds),
            "train_seconds": dict(self.train_seconds),
            "weight_sync_seconds": self.weight_sync_seconds,
            "sources": dict(self.sources),
        }


def published() -> Calibration:
    """The article's floors and step times, and the illustrative weight-sync pause."""
    sources = {f"floors.{k}": PUBLISHED_SOURCE for k in FORMAT_KEYS}
    sources |= {f"rollout.{k}": PUBLISHED_SOURCE for k in FORMAT_KEYS}
    sources |= {f"train.{k}": PUBLISHED_SOURCE for k in TRAIN_KEYS}
    sources["weight_sync"] = WEIGHT_SYNC_SOURCE
    return Calibration(
        floors=dict(PUBLISHED_FLOORS),
        rollout_seconds=dict(PUBLISHED_ROLLOUT_SECONDS),
        train_seconds=dict(PUBLISHED_TRAIN_SECONDS),
        weight_sync_seconds=WEIGHT_SYNC_SECONDS,
        sources=sources,
    )


def load(paths: list[Path], base: Calibration | None = None) -> Calibration:
    """``base`` (default :func:`published`) with numbers replaced from each path in turn.

    A path is a mismatch file, or a run directory holding ``summary.json`` (and optionally a
    ``mismatch.json`` beside it, read first).

    Raises:
        ValueError: naming the file and the field, for a missing path, invalid JSON, an unknown key, a
            value that is not a positive finite number (or not one of the allowed words), or a file that
            holds no number to calibrate from.
    """
    calibration = published() if base is None else base
    for path in paths:
        path = Path(path)
        if path.is_dir():
            if (path / MISMATCH_FILE).is_file():
                calibration = _apply_mismatch(calibration, path / MISMATCH_FILE)
            if not (path / SUMMARY_FILE).is_file():
                raise ValueError(f"{path}: a run directory must hold {SUMMARY_FILE}")
            calibration = _apply_summary(calibration, path / SUMMARY_FILE)
        elif path.is_file():
            calibration = _apply_mismatch(calibration, path)
        else:
            raise ValueError(f"{path}: no such file or directory")
    return calibration


class _Updates:
    """Numbers read from one file, with their sources, applied at the end."""

    def __init__(self, calibration: Calibration) -> None:
        self.floors = dict(calibration.floors)
        self.rollout = dict(calibration.rollout_seconds)
        self.train = dict(calibration.train_seconds)
        self.weight_sync = calibration.weight_sync_seconds
        self.sources = dict(calibration.sources)
        self.count = 0

    def set(self, table: dict | None, name: str, key: str, value: float, source: str) -> None:
        if table is None:
            self.weight_sync = value
        else:
            table[key] = value
        self.sources[name] = source
        self.count += 1

    def build(self, path: Path) -> Calibration:
        if not self.count:
            raise ValueError(f"{path}: holds no number to calibrate from (floors, step times)")
        return Calibration(self.floors, self.rollout, self.train, self.weight_sync, self.sources)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a JSON object, got {type(data).__name__}")
    return data


def _number(path: Path, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{path}: field {name!r} must be a positive finite number, got {value!r}")
    return float(value)


def _flag(path: Path, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: field {name!r} must be true or false, got {value!r}")
    return value


def _object(path: Path, name: str, value: object, allowed: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{path}: field {name or '(top level)'!r} must be an object, got {value!r}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        prefix = f"{name}." if name else ""
        raise ValueError(f"{path}: field {prefix + unknown[0]!r} is unknown; allowed: {', '.join(allowed)}")
    return value


def _plan(path: Path, data: dict, prefix: str = "") -> dict[str, bool]:
    plan = dict(ARTICLE_PLAN)
    for key in plan:
        if key in data:
            plan[key] = _flag(path, f"{prefix}{key}", data[key])
    return plan


def _set_floor(updates: _Updates, key: str, measured: float, plan: dict[str, bool], source: str) -> None:
    note = source
    if key != "bf16" and plan != ARTICLE_PLAN:
        measured = format_floor_from_measurement(measured, bf16_floor=updates.floors["bf16"], **plan)
        note += f" (measured under bf16_last_15={plan['bf16_last_15']}, "
        note += f"bf16_shared_experts={plan['bf16_shared_experts']}; converted to the table floor)"
    updates.set(updates.floors, f"floors.{key}", key, measured, note)


def _apply_mismatch(calibration: Calibration, path: Path) -> Calibration:
    data = _object(path, "", _read_json(path), ("source", "plan", "floors", "step_seconds"))
    label = str(path) + (f" [{data['source']}]" if isinstance(data.get("source"), str) else "")
    if "source" in data and not isinstance(data["source"], str):
        raise ValueError(f"{path}: field 'source' must be a string, got {data['source']!r}")
    plan = _plan(path, _object(path, "plan", data.get("plan", {}), tuple(ARTICLE_PLAN)), "plan.")
    updates = _Updates(calibration)
    floors = _object(path, "floors", data.get("floors", {}), FORMAT_KEYS)
    # BF16 first: the other floors are converted relative to it.
    for key in sorted(floors, key=lambda k: k != "bf16"):
        _set_floor(updates, key, _number(path, f"floors.{key}", floors[key]), plan, f"{label}: floors.{key}")
    steps = _object(path, "step_seconds", data.get("step_seconds", {}), ("rollout", "train", "weight_sync"))
    for key, value in _object(path, "step_seconds.rollout", steps.get("rollout", {}), FORMAT_KEYS).items():
        name = f"step_seconds.rollout.{key}"
        updates.set(updates.rollout, f"rollout.{key}", key, _number(path, name, value), f"{label}: {name}")
    for key, value in _object(path, "step_seconds.train", steps.get("train", {}), TRAIN_KEYS).items():
        name = f"step_seconds.train.{key}"
        updates.set(updates.train, f"train.{key}", key, _number(path, name, value), f"{label}: {name}")
    if "weight_sync" in steps:
        value = _number(path, "step_seconds.weight_sync", steps["weight_sync"])
        updates.set(None, "weight_sync", "", value, f"{label}: step_seconds.weight_sync")
    return updates.build(path)


def _word(path: Path, name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{path}: field {name!r} must be one of {', '.join(allowed)}, got {value!r}")
    return value  # type: ignore[return-value]


def _apply_summary(calibration: Calibration, path: Path) -> Calibration:
    data = _read_json(path)
    if "precision" not in data:
        raise ValueError(f"{path}: field 'precision' is missing (one of {', '.join(PRECISIONS)})")
    precision = _word(path, "precision", data["precision"], PRECISIONS)
    four_over_six = _flag(path, "four_over_six", data.get("four_over_six", False))
    backward = _word(path, "backward", data.get("backward", "dequantized"), BACKWARDS)
    fmt = format_key(precision, four_over_six)
    updates = _Updates(calibration)
    if "fresh_logprob_abs_diff_mean" in data:
        measured = _number(path, "fresh_logprob_abs_diff_mean", data["fresh_logprob_abs_diff_mean"])
        _set_floor(updates, fmt, measured, _plan(path, data), f"{path}: fresh_logprob_abs_diff_mean")
    elif "logprob_abs_diff_mean" in data:
        measured = _number(path, "logprob_abs_diff_mean", data["logprob_abs_diff_mean"])
        note = f"{path}: logprob_abs_diff_mean"
        staleness = data.get("max_staleness", 0)
        if staleness:
            note += f" (all tokens of a run with max_staleness {staleness}: includes staleness mismatch)"
        _set_floor(updates, fmt, measured, _plan(path, data), note)
    if "rollout_seconds_per_step" in data:
        value = _number(path, "rollout_seconds_per_step", data["rollout_seconds_per_step"])
        updates.set(updates.rollout, f"rollout.{fmt}", fmt, value, f"{path}: rollout_seconds_per_step")
    if "train_seconds_per_step" in data:
        key = train_key(precision, backward == "dequantized")
        value = _number(path, "train_seconds_per_step", data["train_seconds_per_step"])
        updates.set(updates.train, f"train.{key}", key, value, f"{path}: train_seconds_per_step")
    if "weight_sync_seconds" in data:
        value = _number(path, "weight_sync_seconds", data["weight_sync_seconds"])
        updates.set(None, "weight_sync", "", value, f"{path}: weight_sync_seconds")
    return updates.build(path)
