"""Step times from a stability grid's results file (``benchmarks/stability/``), read into
:class:`nibble.simulator.calibrate.Updates`.

The file is recognised by its own marker, ``"benchmark": "stability"``. What it calibrates, and why:

- **rollout seconds** per format key: the mean ``generate_seconds`` over every step of every timed run
  whose variant (its plan knobs, as the file's ``variants`` records them) matches :data:`ROLLOUT_PLANS`:
  ``bf16``; ``mxfp8``; ``nvfp4`` = the naive NVFP4 forward (per-tensor activation scales, no 4/6, no BF16
  layers: ``nvfp4_naive``, ``nvfp4_deq``); ``nvfp4_4o6`` = that forward with four-over-six (``nvfp4_4o6``,
  ``nvfp4_4o6_deq``). The backward does not run while generating, so it does not select.
- **train seconds** per train key (precision + backward): the mean ``train_seconds`` of the variants of
  :data:`TRAIN_PLANS` (``bf16``; ``mxfp8`` with its backward; ``nvfp4_naive`` for the high-precision
  backward, ``nvfp4_deq`` for the dequantised one). ``mxfp8_high_precision`` is in no grid: it stays as it was.
- **weight sync** per format key: the mean ``publish_seconds`` of the variants of that key's
  :data:`ROLLOUT_PLANS` entry, the runs its rollout seconds come from (the trainer's ``published_state``
  and the quantisation, in one process: no transfer, so a lower bound of a real weight-sync pause). Per
  format, because quantising is the cost: on an H200 NVFP4 published in 1.13 s per step and BF16 in
  0.16 s, and one pause pooled over both makes BF16 pay for NVFP4's quantisation (and NVFP4 not pay it
  all), a silent advantage for the quantised plan. A format the file has no
  timed run of keeps the pause it had (the published, illustrative 5 s unless an earlier file set it).
  It is set so that the pause is on the same machine's scale as the step times (the article's 5 s beside
  a small model's sub-second steps would dominate every timeline).

Seconds are wall-clock seconds of one step's whole batch (``groups_per_step`` groups on one engine) on the
machine the file names; the simulator uses them as one sampler's rollout time at its budget, so what
carries over is the ratio between formats and between generating and training (its speed-ups are ratios
against synchronous BF16 under the same calibration, at BF16's own step times and pause).

What it does **not** calibrate:

- **floors**: Nibble's trainer scores π_old with the sampler's own numerics, so the staleness-0 mismatch
  (``fresh_logprob_abs_diff``) is no BF16-trainer-against-quantised-sampler floor, the article's quantity.
  With per-token activation scales it is ~1e-9, zero by construction; with per-tensor scales (``nvfp4_naive``,
  ``nvfp4_4o6``, ``nvfp4_deq``, ``nvfp4_4o6_deq``) it is ~0.04 on the CPU grid, because one activation
  scale covers a different set of tokens in the trainer's batch than in the sampler's. Neither measures
  the floor; the ``plain_bf16`` rows of ``nibble mismatch`` (or the mismatch benchmark) do.
- **the spike law and the staleness cost**: the model's spikes are drift kicks of an assumed size with an
  assumed probability, and its staleness cost is a coefficient fitted to the article's model. The grid
  measures grad-norm spikes per 100 steps and the mismatch by staleness, which ``nibble report stability
  --simulate`` sets beside the model's prediction (:mod:`nibble.analysis.stability_compare`) instead of
  feeding them in: a 50-step, small-model grid is too short to fit a law that the simulator would then
  apply to a 30B model.

Files written before the step times were recorded hold no step with ``generate_seconds``: such runs are
skipped, and a file with no timed run is refused (it holds no number to calibrate from).
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING

from nibble.simulator.calibration_files import _object, _seconds, _word, is_real

if TYPE_CHECKING:
    from nibble.simulator.calibrate import Updates

MARKER = ("benchmark", "stability")
# The pilots' record (benchmarks/stability/pilot.py) is a stability benchmark's file that calibrates and
# reports nothing: named, so that one passed by mistake is refused as what it is.
PILOTS_MARKER = "stability_pilots"
PILOTS_FILE = "a stability pilots file (benchmarks/stability/pilot.py)"
# Plan knobs a variant may record, and the values each may take (nibble.recipe.PrecisionPlan's).
KNOBS = {
    "format": ("bf16", "mxfp8", "nvfp4"),
    "activation_scale": ("per_token", "per_tensor"),
    "four_over_six": (None, "mse", "mae"),
    "backward": ("high_precision", "dequantized", "quantized"),
    "bf16_last_fraction": None,  # a number in [0, 1]
    "bf16_shared_experts": (True, False),
}
# The naive forward: per-tensor activation scales and no layer kept in BF16.
_NAIVE_FORWARD = {"activation_scale": ("per_tensor",), "bf16_last_fraction": (0.0,), "bf16_shared_experts": (False,)}
# Per key, the knob values a variant must state for its times to count.
ROLLOUT_PLANS = {
    "bf16": {"format": ("bf16",)},
    "mxfp8": {"format": ("mxfp8",)},
    "nvfp4": {"format": ("nvfp4",), "four_over_six": (None,), **_NAIVE_FORWARD},
    "nvfp4_4o6": {"format": ("nvfp4",), "four_over_six": ("mse", "mae"), **_NAIVE_FORWARD},
}
TRAIN_PLANS = {
    "bf16": {"format": ("bf16",)},
    "mxfp8_high_precision": {"format": ("mxfp8",), "backward": ("high_precision",)},
    "mxfp8_dequantized": {"format": ("mxfp8",), "backward": ("dequantized",)},
    "nvfp4_high_precision": {**ROLLOUT_PLANS["nvfp4"], "backward": ("high_precision",)},
    "nvfp4_dequantized": {**ROLLOUT_PLANS["nvfp4"], "backward": ("dequantized",)},
}
TIMED = ("generate_seconds", "train_seconds", "publish_seconds")  # every timed step has all three


def is_stability(data: object) -> bool:
    """Whether ``data`` (a parsed JSON file) says it is a stability grid's results."""
    return isinstance(data, dict) and data.get(MARKER[0]) == MARKER[1]


def has_step_times(data: dict) -> bool:
    """Whether any step of a stability results file records its seconds (files before them do not)."""
    runs = data.get("runs") if isinstance(data, dict) else None
    return isinstance(runs, list) and any(
        isinstance(run, dict) and isinstance(run.get("steps"), list)
        and any(isinstance(step, dict) and TIMED[0] in step for step in run["steps"])
        for run in runs
    )  # fmt: skip


def read_stability(updates: Updates, path: Path, data: dict) -> None:
    """Put the step times of a stability results file (parsed as ``data``) into ``updates``.

    Raises:
        ValueError: naming ``path`` and the field: a missing or malformed ``runs``, ``variants`` or step,
            a run of a variant the file does not define, a plan knob or value the plans do not have, a
            step with only some of the timing fields or seconds that are not positive numbers; and as
            :func:`nibble.analysis.stability_report.check_values` (a repeated run, misnumbered steps, a
            number out of range).
        nibble.simulator.calibrate.NothingToCalibrate: (a ``ValueError``) a file with no timed step of a
            matching variant: nothing to calibrate from.
    """
    from nibble.analysis.stability_report import check_values

    updates.start()
    variants = _variants(path, data.get("variants"))
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{path}: field 'runs' must be a non-empty list of runs")
    timed: dict[str, list[dict]] = {}  # variant -> its timed steps
    counts: dict[str, int] = {}  # variant -> timed runs
    loads = run_loads(data)
    timed_loads: dict[str, set[str]] = {}  # variant -> the loads its timed runs ran under
    for i, run in enumerate(runs):
        run = _object(path, f"runs[{i}]", run)
        variant = _word(path, f"runs[{i}].variant", run.get("variant"), tuple(variants))
        steps = run.get("steps")
        if not isinstance(steps, list) or not steps:
            raise ValueError(f"{path}: field 'runs[{i}].steps' must be a non-empty list of step records")
        kept = [_timed_step(path, f"runs[{i}].steps[{j}]", step) for j, step in enumerate(steps)]
        if all(kept):
            timed.setdefault(variant, []).extend(kept)
            counts[variant] = counts.get(variant, 0) + 1
            timed_loads.setdefault(variant, set()).add(loads.get((variant, run.get("seed")), UNKNOWN_LOAD))
        elif any(kept):
            raise ValueError(f"{path}: runs[{i}] times some steps but not others ({TIMED[0]} missing in part)")
    check_values(path, data)
    label = source_label(path, data) + mixed_loads(data)
    for key, plan in ROLLOUT_PLANS.items():
        names = _matching(variants, plan, timed)
        args = (names, timed, counts, timed_loads)
        _mean_into(updates, updates.rollout, "rollout", key, *args, "generate_seconds", label)
        _mean_into(updates, updates.weight_sync, "weight_sync", key, *args, "publish_seconds", label)
    for key, plan in TRAIN_PLANS.items():
        names = _matching(variants, plan, timed)
        _mean_into(updates, updates.train, "train", key, names, timed, counts, timed_loads, "train_seconds", label)
    updates.finish(path, _nothing_timed(variants, timed))


def source_label(path: Path, data: dict) -> str:
    """What the sources of the numbers a stability file sets begin with (before ``": "``): the file, the
    machine and the response budget."""
    return f"{path} [stability grid{_machine(data)}{_budget(data)}]"


def run_loads(data: dict) -> dict[tuple[object, object], str]:
    """How busy the machine was for each run, by ``(variant, seed)``: from the part that ran it (``parts``,
    or the file's one ``machine`` when it has no parts), e.g. ``"3 runs at a time per GPU, CUDA MPS"``, and
    which NVFP4 GEMMs it ran where the record names them (``machine.nvfp4_gemm``, from 2026-12-02: the
    block-ordered kernels decode faster and train slower than the GEMM before them) and where weight-sync's
    quantise ran (``machine.publish_quantize``; GPU parts without it quantised on the CPU), named
    "(unrecorded)" where the record predates its field. Step times are
    wall-clock seconds, so runs sharing a GPU are slower by their company, not their plan.
    A part without the record gives :data:`UNKNOWN_LOAD`; nothing here raises."""
    parts = data.get("parts")
    if not isinstance(parts, list):
        parts = [{"machine": data.get("machine"), "runs": [[r.get("variant"), r.get("seed")] for r in data["runs"]
                                                           if isinstance(r, dict)]}]  # fmt: skip
    loads = {}
    for part in parts:
        if not isinstance(part, dict) or not isinstance(part.get("runs"), list):
            continue
        load = _load(part.get("machine"))
        for run in part["runs"]:
            if isinstance(run, list) and len(run) == 2:
                loads[run[0], run[1]] = load
    return loads


UNKNOWN_LOAD = "load not recorded"


def _load(machine: object) -> str:
    if not isinstance(machine, dict):
        return UNKNOWN_LOAD
    devices = machine.get("devices")
    if isinstance(devices, list) and devices and all(isinstance(d, str) for d in devices) and devices[0] != "cpu":
        at_once = max(devices.count(d) for d in devices)
        mps = {True: ", CUDA MPS", False: ", time-sliced"}.get(machine.get("cuda_mps"), "")
        # GPU records got these fields with the change they describe: a record without one ran what came before
        gemm = machine.get("nvfp4_gemm", "before docs/design.md §2.6 (unrecorded)")
        gemm = f", NVFP4 GEMMs {gemm}" if isinstance(gemm, str) else ""
        publish = machine.get("publish_quantize", "on the CPU (unrecorded)")
        publish = f", weight-sync quantise {publish}" if isinstance(publish, str) else ""
        return f"{at_once} run{'s' if at_once > 1 else ''} at a time per GPU{mps}{gemm}{publish}"
    workers = machine.get("workers")
    return f"{workers} CPU worker processes" if is_real(workers) else UNKNOWN_LOAD


def mixed_loads(data: dict) -> str:
    """A warning (to append to :func:`source_label`) for a stability file whose timed runs ran under
    different loads (:func:`run_loads`; parts appended from other sessions), else ``""``."""
    loads = run_loads(data)
    every = sorted({
        loads.get((run.get("variant"), run.get("seed")), UNKNOWN_LOAD)
        for run in data["runs"]
        if isinstance(run, dict) and isinstance(run.get("steps"), list)
        and any(isinstance(step, dict) and TIMED[0] in step for step in run["steps"])
    })  # fmt: skip
    if len(every) <= 1:
        return ""
    return (
        f" (WARNING: its timed runs ran under different loads — {' / '.join(every)} — so ratios between their "
        "step times are partly the load's)"
    )


def rollout_key(knobs: dict) -> str | None:
    """The format key whose rollout seconds and pause a variant of plan ``knobs`` is timed for (``None`` when
    its plan is none of :data:`ROLLOUT_PLANS`: the simulator would give it another plan's times)."""
    return next((key for key, plan in ROLLOUT_PLANS.items() if _states(knobs, plan)), None)


def _nothing_timed(variants: dict[str, dict], timed: dict[str, list]) -> str:
    """Why a file set no number: no timed run at all, or timed runs of plans no key is measured under."""
    if timed:
        what = f"its timed variants ({', '.join(name for name in variants if name in timed)}) match no plan"
    else:
        what = f"no step records {TIMED[0]} (a file written before step times were recorded?)"
    return (
        f"{what}; step times calibrate only bf16, mxfp8 and NVFP4's naive forward (per-tensor activation scales, "
        "no BF16 layers, with or without 4/6); a stability file never gives floors: see "
        "nibble.simulator.stability_calibration"
    )


def _variants(path: Path, value: object) -> dict[str, dict]:
    variants = _object(path, "variants", value)
    if not variants:
        raise ValueError(f"{path}: field 'variants' must name the plan knobs of each variant, got {{}}")
    for name, knobs in variants.items():
        knobs = _object(path, f"variants.{name}", knobs, tuple(KNOBS))
        for knob, value in knobs.items():
            where = f"variants.{name}.{knob}"
            if KNOBS[knob] is not None:
                _word(path, where, value, KNOBS[knob])
            elif not is_real(value) or not 0 <= value <= 1:
                raise ValueError(f"{path}: field {where!r} must be a fraction in [0, 1], got {value!r}")
        if "format" not in knobs:
            raise ValueError(f"{path}: field 'variants.{name}.format' is missing")
    return variants


def _timed_step(path: Path, where: str, step: object) -> dict | None:
    """The step's seconds, or ``None`` for a step recorded before step times were (no timing field)."""
    step = _object(path, where, step)
    present = [name for name in TIMED if name in step]
    if not present:
        return None
    if len(present) < len(TIMED):
        missing = next(name for name in TIMED if name not in step)
        raise ValueError(f"{path}: {where}: field '{missing}' is missing (the step records {present[0]})")
    return {name: _seconds(path, f"{where}.{name}", step[name]) for name in TIMED}


def _matching(variants: dict[str, dict], plan: dict[str, tuple], timed: dict[str, list]) -> list[str]:
    """Timed variants stating every knob of ``plan`` with an allowed value."""
    return [name for name, knobs in variants.items() if name in timed and _states(knobs, plan)]


def _states(knobs: dict, plan: dict[str, tuple]) -> bool:
    """Whether ``knobs`` state every knob of ``plan`` with an allowed value."""
    return all(k in knobs and _is_one_of(knobs[k], allowed) for k, allowed in plan.items())


def _is_one_of(value: object, allowed: tuple) -> bool:
    return any(value == a and type(value) is type(a) for a in allowed) or (
        is_real(value) and any(is_real(a) and float(value) == a for a in allowed)
    )


def _mean_into(updates, table, prefix: str, key: str, names: list[str], timed: dict, counts: dict, loads: dict,
               field: str, label: str) -> None:  # fmt: skip
    """Set ``prefix.key`` to the mean ``field`` over the timed steps of ``names`` (nothing when none)."""
    if not names:
        return
    steps = [s for name in names for s in timed[name]]
    runs = sum(counts[name] for name in names)
    under = sorted({load for name in names for load in loads[name]})
    what = f"mean {field} over {len(steps)} steps of {runs} runs of {', '.join(names)} ({'; '.join(under)})"
    updates.set(table, f"{prefix}.{key}", key, fmean(s[field] for s in steps), f"{label}: {what}")


def _machine(data: dict) -> str:
    """`` on <gpu or cpu>`` from the file's ``machine`` record (empty when it has none)."""
    machine = data.get("machine")
    if not isinstance(machine, dict):
        return ""
    name = machine.get("gpu") or machine.get("cpu")
    return f" on {name}" if isinstance(name, str) else ""


def _budget(data: dict) -> str:
    setting = data.get("setting")
    tokens = setting.get("max_new_tokens") if isinstance(setting, dict) else None
    return f", responses of at most {tokens} tokens" if is_real(tokens) else ""
