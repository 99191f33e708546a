"""The files that calibrate the simulator, read into :class:`nibble.simulator.calibrate.Updates`.

Accepted (README.md "Calibration" documents them):

- ``nibble mismatch --json`` output: a JSON list of rows ``{"plan", "trainer", "logprob_abs_diff",
  "mismatch_kl", "tokens"}``;
- the mismatch benchmark's record (``benchmarks/results/mismatch.json``): ``{"benchmark": "mismatch",
  "checkpoint", "prompts", "machine", "rows": [the same rows]}`` (later records add ``"command"``,
  ``"config"``, ``"device"``, ``"quantize"``). From both, only the ``plain_bf16`` rows
  count (a BF16 trainer against the quantised sampler, the article's arrangement; the
  ``same_quantized_forward`` rows are ~0 by construction) of the plans ``bf16`` and
  ``<mxfp8|nvfp4|nvfp4+4/6> tail15=on shared_bf16=off`` (the article's plan);
- a hand-written *mismatch file*::

    {"source": "free text", "plan": {"bf16_last_15": true, "bf16_shared_experts": false},
     "floors": {"bf16": 0.011, "mxfp8": 0.02, "nvfp4": 0.041, "nvfp4_4o6": 0.031},        # any subset
     "step_seconds": {"rollout": {"bf16": 109.4, ...}, "train": {"nvfp4_dequantized": 70.4, ...},
                      "weight_sync": {"bf16": 5.0, "nvfp4": 6.0, ...}}}

  (``weight_sync`` as one number, as files before the pause was per format give it, is every format's);

- a stability grid's results file (``"benchmark": "stability"``): step times only, see
  :mod:`nibble.simulator.stability_calibration` for what it can and cannot calibrate;
- a *run directory* holding ``summary.json`` as ``nibble run`` writes it (``precision``, ``four_over_six``,
  ``logprob_abs_diff_mean``, ``fresh_logprob_abs_diff_mean``, ``config`` with ``config.plan`` and
  ``config.trainer.max_staleness``; its optional step times and ``weight_sync_seconds`` are the run's
  format's), and a ``mismatch.json`` beside it if present.

Every field is checked: an unknown key, a value out of its range or a word not allowed fails naming the
file and the field.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from nibble.simulator.drift_model import FORMAT_KEYS, PRECISIONS, TRAIN_KEYS, format_key, train_key

if TYPE_CHECKING:
    from nibble.simulator.calibrate import Updates

# The plan the article's floors were measured under.
ARTICLE_PLAN = {"bf16_last_15": True, "bf16_shared_experts": False}
MISMATCH_FILE = "mismatch.json"  # in a run directory, beside summary.json
SUMMARY_FILE = "summary.json"
# A measured floor is a mean |Δlogprob| per token; above 1 nat it is no precision floor (and the model's
# arithmetic would overflow for absurd values, e.g. 1e300 makes the drift NaN).
MAX_FLOOR = 1.0
# Seconds per train step (or per weight-sync pause) beyond this (11.6 days) are not measurements.
MAX_STEP_SECONDS = 1e6
# `nibble mismatch` rows: plans are "bf16" and "<name> tail15=<on|off> shared_bf16=<on|off>".
ROW_TRAINERS = ("same_quantized_forward", "plain_bf16")
ROW_TRAINER = "plain_bf16"  # a BF16 trainer against the quantised sampler: the article's arrangement
ROW_FORMATS = {"mxfp8": "mxfp8", "nvfp4": "nvfp4", "nvfp4+4/6": "nvfp4_4o6"}
ROW_PLANS = frozenset(
    {"bf16"}
    | {
        f"{name} tail15={tail} shared_bf16={shared}"
        for name in ROW_FORMATS
        for tail in ("on", "off")
        for shared in ("on", "off")
    }
)
# The rows that calibrate, one per floor: the article's plan (last 15% BF16, shared experts not BF16).
ROW_FLOORS = {"bf16": "bf16"} | {f"{name} tail15=on shared_bf16=off": key for name, key in ROW_FORMATS.items()}
# Nibble's plan values (nibble.config.PlanConfig) in a run summary.
FOUR_OVER_SIX_METRICS = ("mse", "mae")
RUN_BACKWARDS = ("high_precision", "dequantized", "quantized")
LAST_FRACTIONS = {0.0: False, 0.15: True}  # the model knows "last 15% BF16" on or off


def is_real(value: object) -> bool:
    """A finite int or float (not a bool); an integer past the float range is not (JSON allows one)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class RepeatedKey(ValueError):
    """A JSON object that gives one key twice (raised by :func:`unique_keys`)."""


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``'s ``object_pairs_hook`` that refuses a key given twice in one object: JSON would keep
    the last one silently, so a number written twice would count with whichever came last.

    Raises:
        RepeatedKey: naming the key and the object's keys.
    """
    counts = Counter(key for key, _ in pairs)
    repeated = sorted(key for key, n in counts.items() if n > 1)
    if repeated:
        raise RepeatedKey(f"key {repeated[0]!r} appears twice in the object with keys {', '.join(counts)}")
    return dict(pairs)


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(), object_pairs_hook=unique_keys)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    except RepeatedKey as exc:
        raise ValueError(f"{path}: {exc}") from None


def _floor(path: Path, name: str, value: object) -> float:
    """A measured floor: a finite number of nats per token in [0, MAX_FLOOR] (0: trainer and sampler agree)."""
    if not is_real(value) or not 0 <= value <= MAX_FLOOR:
        raise ValueError(
            f"{path}: field {name!r} must be a number in [0, {MAX_FLOOR:g}] (a mean |Δlogprob| in nats per token), "
            f"got {value!r}"
        )
    return float(value)


def _seconds(path: Path, name: str, value: object) -> float:
    if not is_real(value) or not 0 < value <= MAX_STEP_SECONDS:
        raise ValueError(
            f"{path}: field {name!r} must be a positive number of seconds, at most {MAX_STEP_SECONDS:g}, got {value!r}"
        )
    return float(value)


def _flag(path: Path, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: field {name!r} must be true or false, got {value!r}")
    return value


def _object(path: Path, name: str, value: object, allowed: tuple[str, ...] | None = None) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{path}: field {name or '(top level)'!r} must be an object, got {value!r}")
    unknown = sorted(set(value) - set(allowed)) if allowed is not None else []
    if unknown:
        prefix = f"{name}." if name else ""
        raise ValueError(f"{path}: field {prefix + unknown[0]!r} is unknown; allowed: {', '.join(allowed)}")
    return value


def _word(path: Path, name: str, value: object, allowed: tuple) -> object:
    """``value`` if it is one of ``allowed`` (same type too: ``0`` is not ``false``), else an error naming ``name``."""
    if not any(value == a and type(value) is type(a) for a in allowed):
        shown = ", ".join(a if isinstance(a, str) else json.dumps(a) for a in allowed)
        raise ValueError(f"{path}: field {name!r} must be one of {shown}, got {value!r}")
    return value


def _plan(path: Path, data: dict, prefix: str = "") -> dict[str, bool]:
    plan = dict(ARTICLE_PLAN)
    for key in plan:
        if key in data:
            plan[key] = _flag(path, f"{prefix}{key}", data[key])
    return plan


def read_mismatch(updates: Updates, path: Path) -> None:
    """Put the numbers of a mismatch file (any of the three shapes above), or the step times of a
    stability grid's results (``"benchmark": "stability"``: :mod:`nibble.simulator.stability_calibration`),
    into ``updates``.

    Raises:
        ValueError: naming ``path`` and the field, for an unreadable file, invalid JSON, an unknown key, a
            value out of range, or a file holding no number to calibrate from; naming what the file is for
            another benchmark's record (the stability pilots', say).
    """
    from nibble.simulator.stability_calibration import is_stability, read_stability

    updates.start()
    data = _read_json(path)
    if is_stability(data):
        read_stability(updates, path, data)
    elif isinstance(data, list):
        _apply_rows(updates, path, data, "rows", f"{path} [nibble mismatch --json]")
    elif isinstance(data, dict) and "rows" in data:
        _apply_benchmark(updates, path, data)
    elif isinstance(data, dict):
        _refuse_other_benchmarks(path, data)
        _apply_floors_file(updates, path, data)
    else:
        raise ValueError(
            f"{path}: the top level must be a JSON object (a mismatch file, the mismatch benchmark's record) or "
            f"a list (nibble mismatch --json), got {type(data).__name__}"
        )


def _refuse_other_benchmarks(path: Path, data: dict) -> None:
    """A file without ``rows`` that names a ``"benchmark"`` is refused by name (a mismatch file names none)."""
    from nibble.simulator.stability_calibration import PILOTS_FILE, PILOTS_MARKER  # it imports this module

    kind = data.get("benchmark")
    if kind is None:
        return
    if kind == "mismatch":
        raise ValueError(f"{path}: field 'rows' is missing (the mismatch benchmark's record holds its rows)")
    if kind == PILOTS_MARKER:  # the pilots' choice of learning rate and staleness: no step times or floors
        what = f"{PILOTS_FILE}, not a stability or mismatch results file: it holds no step times or floors"
    else:
        what = f"the {kind!r} benchmark's record, not a stability or mismatch results file"
    raise ValueError(
        f'{path}: {what}; calibrate from a stability grid\'s results ("benchmark": "stability") or a mismatch file'
    )


def _apply_benchmark(updates: Updates, path: Path, data: dict) -> None:
    """The mismatch benchmark's record: ``{"benchmark": "mismatch", "checkpoint", "prompts", "machine", "rows"}``
    (since 2026-12-02 also ``"command"``, ``"config"``, ``"device"`` and ``"quantize"``)."""
    if data.get("benchmark", "mismatch") != "mismatch":
        raise ValueError(f"{path}: field 'benchmark' must be \"mismatch\", got {data['benchmark']!r}")
    details = [f"{k} {data[k]}" for k in ("checkpoint", "device", "prompts") if isinstance(data.get(k), (str, int))]
    label = f"{path} [mismatch benchmark{', ' if details else ''}{', '.join(details)}]"
    _apply_rows(updates, path, data["rows"], "rows", label)


def _apply_rows(updates: Updates, path: Path, rows: object, name: str, label: str) -> None:
    """``nibble mismatch`` rows: the ``plain_bf16`` rows of the article's plan (and ``bf16``) give the floors."""
    if not isinstance(rows, list):
        raise ValueError(f"{path}: field {name!r} must be a list of rows, got {rows!r}")
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        where = f"{name}[{i}]"
        row = _object(path, where, row)
        plan = _word(path, f"{where}.plan", row.get("plan"), tuple(sorted(ROW_PLANS)))
        trainer = _word(path, f"{where}.trainer", row.get("trainer"), ROW_TRAINERS)
        value = _floor(path, f"{where}.logprob_abs_diff", row.get("logprob_abs_diff"))
        if trainer != ROW_TRAINER or plan not in ROW_FLOORS:
            continue
        key = ROW_FLOORS[plan]
        if key in seen:
            raise ValueError(f"{path}: {where} repeats plan {plan!r}, trainer {trainer} of {name}[{seen[key]}]")
        seen[key] = i
        tokens = row.get("tokens")
        over = f" over {tokens} tokens" if is_real(tokens) else ""
        source = f"{label}: {where} (plan {plan!r}, trainer {trainer}, logprob_abs_diff{over})"
        updates.floor(key, value, ARTICLE_PLAN, source)
    updates.finish(path, f"no {ROW_TRAINER} row for plan {', '.join(repr(p) for p in ROW_FLOORS)}")


def _apply_floors_file(updates: Updates, path: Path, data: dict) -> None:
    data = _object(path, "", data, ("source", "plan", "floors", "step_seconds"))
    if "source" in data and not isinstance(data["source"], str):
        raise ValueError(f"{path}: field 'source' must be a string, got {data['source']!r}")
    label = str(path) + (f" [{data['source']}]" if "source" in data else "")
    plan = _plan(path, _object(path, "plan", data.get("plan", {}), tuple(ARTICLE_PLAN)), "plan.")
    for key, value in _object(path, "floors", data.get("floors", {}), FORMAT_KEYS).items():
        updates.floor(key, _floor(path, f"floors.{key}", value), plan, f"{label}: floors.{key}")
    steps = _object(path, "step_seconds", data.get("step_seconds", {}), ("rollout", "train", "weight_sync"))
    for key, value in _object(path, "step_seconds.rollout", steps.get("rollout", {}), FORMAT_KEYS).items():
        name = f"step_seconds.rollout.{key}"
        updates.set(updates.rollout, f"rollout.{key}", key, _seconds(path, name, value), f"{label}: {name}")
    for key, value in _object(path, "step_seconds.train", steps.get("train", {}), TRAIN_KEYS).items():
        name = f"step_seconds.train.{key}"
        updates.set(updates.train, f"train.{key}", key, _seconds(path, name, value), f"{label}: {name}")
    _apply_weight_sync(updates, path, steps, label)
    updates.finish(path)


def _apply_weight_sync(updates: Updates, path: Path, steps: dict, label: str) -> None:
    """``step_seconds.weight_sync``: an object of pauses per format key (any subset), or one number, as files
    written before the pause was per format hold, which is every format's pause (so it replaces the pauses an
    earlier file set per format).

    Raises:
        ValueError: naming ``path`` and the field: an unknown key, a value neither an object nor a number, or
            seconds not in (0, MAX_STEP_SECONDS].
    """
    if "weight_sync" not in steps:
        return
    value = steps["weight_sync"]
    if isinstance(value, dict):
        for key, seconds in _object(path, "step_seconds.weight_sync", value, FORMAT_KEYS).items():
            name = f"step_seconds.weight_sync.{key}"
            pause = _seconds(path, name, seconds)
            updates.set(updates.weight_sync, f"weight_sync.{key}", key, pause, f"{label}: {name}")
        return
    if not is_real(value):  # a list, a word, null: name both forms, not only the older one
        raise ValueError(
            f"{path}: field 'step_seconds.weight_sync' must be an object of seconds per format key "
            f"({', '.join(FORMAT_KEYS)}) or one number of seconds (every format's pause), got {value!r}"
        )
    value = _seconds(path, "step_seconds.weight_sync", value)
    source = f"{label}: step_seconds.weight_sync (one number: every format's pause)"
    for key in FORMAT_KEYS:
        updates.set(updates.weight_sync, f"weight_sync.{key}", key, value, source)


def _setting(data: dict, section: dict, key: str, section_key: str, section_name: str) -> tuple[str, object] | None:
    """``(field name, value)`` of a plan setting: the summary's top-level key, else ``config.<section>``'s."""
    if key in data:
        return key, data[key]
    if section_key in section:
        return f"config.{section_name}.{section_key}", section[section_key]
    return None


def read_summary(updates: Updates, path: Path) -> None:
    """Put the numbers of a ``nibble run`` summary into ``updates``: top-level keys win over the run's
    ``config.plan`` / ``config.trainer``.

    Raises:
        ValueError: as :func:`read_mismatch`; also for a plan the model does not know (a ``bf16_last_fraction``
            other than 0 or 0.15 without a top-level ``bf16_last_15``).
    """
    updates.start()
    data = _object(path, "", _read_json(path))
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    plan_cfg = config.get("plan") if isinstance(config.get("plan"), dict) else {}
    trainer_cfg = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}

    found = _setting(data, plan_cfg, "precision", "format", "plan")
    if found is None:
        raise ValueError(f"{path}: field 'precision' is missing (one of {', '.join(PRECISIONS)})")
    precision = _word(path, found[0], found[1], PRECISIONS)
    # four_over_six: a bool (the summary), or Nibble's plan value null | "mse" | "mae".
    found = _setting(data, plan_cfg, "four_over_six", "four_over_six", "plan")
    four_over_six = False
    if found is not None:
        value = _word(path, found[0], found[1], (True, False, None, *FOUR_OVER_SIX_METRICS))
        four_over_six = value is True or value in FOUR_OVER_SIX_METRICS
    found = _setting(data, plan_cfg, "backward", "backward", "plan")
    backward = "dequantized" if found is None else _word(path, found[0], found[1], RUN_BACKWARDS)
    plan = dict(ARTICLE_PLAN)
    found = _setting(data, plan_cfg, "bf16_last_15", "bf16_last_fraction", "plan")
    if found is not None and found[0] == "bf16_last_15":
        plan["bf16_last_15"] = _flag(path, *found)
    elif found is not None:
        fraction = found[1]
        if not is_real(fraction) or float(fraction) not in LAST_FRACTIONS:
            raise ValueError(
                f"{path}: field {found[0]!r} is {fraction!r}; the model knows only 0 and 0.15 (last 15% of layers "
                "in BF16): give the top-level 'bf16_last_15' (true/false) to say which the model should assume"
            )
        plan["bf16_last_15"] = LAST_FRACTIONS[float(fraction)]
    found = _setting(data, plan_cfg, "bf16_shared_experts", "bf16_shared_experts", "plan")
    if found is not None:
        plan["bf16_shared_experts"] = _flag(path, *found)
    found = _setting(data, trainer_cfg, "max_staleness", "max_staleness", "trainer")
    staleness = 0 if found is None else found[1]

    fmt = format_key(precision, four_over_six)
    if data.get("fresh_logprob_abs_diff_mean") is not None:
        measured = _floor(path, "fresh_logprob_abs_diff_mean", data["fresh_logprob_abs_diff_mean"])
        updates.floor(fmt, measured, plan, f"{path}: fresh_logprob_abs_diff_mean")
    elif data.get("logprob_abs_diff_mean") is not None:
        measured = _floor(path, "logprob_abs_diff_mean", data["logprob_abs_diff_mean"])
        note = f"{path}: logprob_abs_diff_mean"
        if staleness:
            note += f" (all tokens of a run with max_staleness {staleness}: includes staleness mismatch)"
        updates.floor(fmt, measured, plan, note)
    if "rollout_seconds_per_step" in data:
        value = _seconds(path, "rollout_seconds_per_step", data["rollout_seconds_per_step"])
        updates.set(updates.rollout, f"rollout.{fmt}", fmt, value, f"{path}: rollout_seconds_per_step")
    if "train_seconds_per_step" in data:
        # The model has no quantized backward: its time is filed under the dequantized one (whose spike law
        # the model would give it too), and the source says so.
        key = train_key(precision, backward != "high_precision")
        value = _seconds(path, "train_seconds_per_step", data["train_seconds_per_step"])
        note = f"{path}: train_seconds_per_step"
        if backward == "quantized" and precision != "bf16":
            note += " (backward 'quantized', filed under the dequantized backward: the model has no quantized one)"
        updates.set(updates.train, f"train.{key}", key, value, note)
    if "weight_sync_seconds" in data:  # the run's own format, as its rollout time
        value = _seconds(path, "weight_sync_seconds", data["weight_sync_seconds"])
        updates.set(updates.weight_sync, f"weight_sync.{fmt}", fmt, value, f"{path}: weight_sync_seconds")
    updates.finish(path)
