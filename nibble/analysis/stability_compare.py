"""``nibble report stability FILE --simulate``: the simulator's drift model beside the measured grid.

For every run of a stability results file, the model of docs/design.md §7 (:mod:`nibble.simulator.dynamics`)
is driven by that run's own batches: its variant's plan gives the precision floor (from the calibration)
and the spike law, and each step's measured mean staleness ``s`` gives the step's staleness cost
``0.011 · s^1.5`` (the cost at the batch's mean gap; the run mixes lags, so this is at most the mean cost
of its trajectories, Jensen). The run's seed seeds the spike draws. Predicted and measured are then set
side by side per variant, mean over seeds:

- spikes per 100 steps: the model's drawn spikes (and its law's ``100 · p``) against grad-norm spikes
  (:mod:`nibble.analysis.stability_events`) per 100 judged steps. Not the same event: a model spike is a
  kick to the drift, a measured one a grad norm 5× its recent median; set side by side as the claim they
  both stand for ("naive NVFP4 spikes");
- collapse: the model's drift past 2.2 against held-out accuracy falling and staying below the warm start;
- mismatch: the model's ``m = staleness cost + 0.5 · f`` against the measured mean |Δlogprob|, and at
  staleness 0 the model's ``0.5 · f`` against ``fresh_logprob_abs_diff`` (Nibble's trainer scores with
  the sampler's numerics, so the measured one is not the article's floor: see
  :mod:`nibble.simulator.stability_calibration`).

Per variant, a fit of the measured mismatch by staleness, ``|Δlogprob| ≈ a + c · s^1.5`` (least squares
over its steps, ``s`` the step's mean staleness), is reported beside the model's ``c = 0.011`` with the
range of ``s`` it covers; it is not fed into the simulator (why: :mod:`nibble.simulator.stability_calibration`).

The model knows no activation-scale knob: variants that differ only in per-token against per-tensor
activation scales get the same prediction.

When the file records step times, :func:`speed_ups` also gives the simulator's speed of each timed
variant's plan, run asynchronously (``max_staleness`` :data:`ASYNC_STALENESS`, the rest of
:class:`~nibble.simulator.config.SimConfig`'s workload), against synchronous BF16, as ``nibble simulate
--calibrate FILE`` with that plan gives it: each side on its own format's rollout, train and weight-sync
seconds from the file. A variant whose plan the step times are not calibrated for, or whose comparison
would need a time the file does not hold (BF16's, say), is skipped with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from nibble.analysis.stability_report import Spread, summarize_run
from nibble.simulator import drift_model
from nibble.simulator.calibrate import Calibration
from nibble.simulator.config import SimConfig
from nibble.simulator.dynamics import run_dynamics
from nibble.simulator.simulate import floor_of, spikes_of, step_names, step_seconds, sync_bf16, sync_bf16_seconds
from nibble.simulator.stability_calibration import TIMED, mixed_loads, rollout_key, source_label
from nibble.simulator.timeline import build_timeline

# nibble.recipe.PrecisionPlan's defaults, for knobs a variant does not state (tests check them against it).
PLAN_DEFAULTS = {
    "four_over_six": "mse",
    "backward": "dequantized",
    "bf16_last_fraction": 0.15,
    "bf16_shared_experts": True,
}
# The model knows the last 15% of layers in BF16 or none.
_LAST_FRACTIONS = {0.0: False, 0.15: True}
# The staleness of the asynchronous side of a speed-up: nibble simulate's default.
ASYNC_STALENESS = SimConfig().max_staleness


def sim_config(variant: str, knobs: dict) -> SimConfig:
    """The simulator's configuration of a variant's plan knobs (``benchmarks/stability/variants.py``).

    Raises:
        ValueError: naming the variant, for a format the model does not know or a ``bf16_last_fraction``
            other than 0 or 0.15 on a quantised format (the model knows only those two).
    """
    knobs = {**PLAN_DEFAULTS, **knobs}
    precision = knobs.get("format")
    if precision not in drift_model.PRECISIONS:
        raise ValueError(f"variant {variant!r}: format {precision!r} is not one of {', '.join(drift_model.PRECISIONS)}")
    fraction = knobs["bf16_last_fraction"]
    if precision != "bf16" and fraction not in _LAST_FRACTIONS:
        raise ValueError(f"variant {variant!r}: bf16_last_fraction {fraction!r}; the model knows only 0 and 0.15")
    return SimConfig(
        precision=precision,
        four_over_six=knobs["four_over_six"] is not None,
        dequantized_backward=knobs["backward"] != "high_precision",  # as read_summary files "quantized"
        bf16_last_15=_LAST_FRACTIONS.get(fraction, False),
        bf16_shared_experts=bool(knobs["bf16_shared_experts"]),
        max_staleness=0,
    )


@dataclass(frozen=True)
class Comparison:
    """Predicted against measured for one variant (means over its seeds)."""

    variant: str
    seeds: int
    floor: float  # the model's precision floor f of the plan, nats/token
    law_spikes_per_100: float  # 100 · p of the model's spike law
    predicted_spikes_per_100: Spread
    measured_spikes_per_100: Spread
    predicted_collapses: int
    measured_collapses: int
    predicted_mismatch: Spread  # the model's m, mean over steps
    measured_mismatch: Spread  # mean |Δlogprob| over steps
    measured_fresh_mismatch: Spread  # staleness-0 |Δlogprob|
    fit: StalenessFit | None  # the measured mismatch by staleness, all seeds' steps

    @property
    def predicted_fresh_mismatch(self) -> float:
        """The model's ``m`` at staleness 0: ``0.5 · f``."""
        return drift_model.batch_mismatch(0.0, self.floor)


@dataclass(frozen=True)
class StalenessFit:
    """``|Δlogprob| ≈ intercept + coefficient · s^1.5`` over ``points`` steps with ``s`` in ``s_range``."""

    intercept: float
    coefficient: float
    points: int
    s_range: tuple[float, float]


def compare(results: dict, calibration: Calibration) -> list[Comparison]:
    """One :class:`Comparison` per variant of a validated results file, in order of first appearance.

    Raises:
        ValueError: a run whose variant the file's ``variants`` does not define, or a step without a
            finite ``staleness_mean`` ≥ 0 (naming the run's variant, seed and step); and as :func:`sim_config`.
    """
    variants = results.get("variants") or {}
    by_variant: dict[str, list[tuple]] = {}
    for i, run in enumerate(results["runs"]):
        name = run["variant"]
        if name not in variants:
            raise ValueError(f"runs[{i}]: variant {name!r} is not in the file's 'variants'")
        config = sim_config(name, variants[name])
        floor, spikes = floor_of(config, calibration), spikes_of(config)
        costs = [drift_model.staleness_cost(_staleness(i, run, j)) for j in range(len(run["steps"]))]
        dynamics = run_dynamics(costs, floor, spikes, run["seed"] % 2**32)
        by_variant.setdefault(name, []).append((run, dynamics, floor, spikes))
    rows = []
    for name, entries in by_variant.items():
        summaries = [summarize_run(run) for run, *_ in entries]
        _, _, floor, spikes = entries[0]
        rows.append(
            Comparison(
                variant=name,
                seeds=len(entries),
                floor=floor,
                law_spikes_per_100=100.0 * spikes.probability,
                predicted_spikes_per_100=Spread.of([100.0 * len(d.spikes) / len(d.drift) for _, d, *_ in entries]),
                measured_spikes_per_100=Spread.of([s.spikes_per_100 for s in summaries]),
                predicted_collapses=sum(d.collapsed_at is not None for _, d, *_ in entries),
                measured_collapses=sum(s.collapse_step is not None for s in summaries),
                predicted_mismatch=Spread.of([fmean(d.mismatch) for _, d, *_ in entries]),
                measured_mismatch=Spread.of([s.logprob_abs_diff for s in summaries]),
                measured_fresh_mismatch=Spread.of([s.fresh_logprob_abs_diff for s in summaries]),
                fit=fit_staleness([run for run, *_ in entries]),
            )
        )
    return rows


def _staleness(index: int, run: dict, step: int) -> float:
    """The step's ``staleness_mean``, refused (naming the run and step) unless a finite number ≥ 0 whose
    staleness cost is finite too (``s^1.5`` overflows past about 1e205)."""
    record = run["steps"][step]
    value = record.get("staleness_mean")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        ok = ok and math.isfinite(drift_model.staleness_cost(float(value))) and value >= 0
    except (OverflowError, ValueError):  # an integer past the float range; a negative gap
        ok = False
    if not ok:
        raise ValueError(
            f"runs[{index}].steps[{step}].staleness_mean = {value!r} (variant {run['variant']!r}, seed {run['seed']!r},"
            f" step {record.get('step')!r}): expected a finite number ≥ 0"
        )
    return float(value)


def fit_staleness(runs: list[dict]) -> StalenessFit | None:
    """Least-squares ``a + c · s^1.5`` of the steps' ``logprob_abs_diff`` on their ``staleness_mean``;
    ``None`` with fewer than two distinct staleness values (nothing to fit a slope to)."""
    points = [
        (float(s["staleness_mean"]) ** 1.5, float(s["logprob_abs_diff"]), float(s["staleness_mean"]))
        for run in runs
        for s in run["steps"]
    ]
    xs = [x for x, _, _ in points]
    if len(set(xs)) < 2:
        return None
    mx, my = fmean(xs), fmean(y for _, y, _ in points)
    slope = sum((x - mx) * (y - my) for x, y, _ in points) / sum((x - mx) ** 2 for x in xs)
    gaps = [s for _, _, s in points]
    return StalenessFit(my - slope * mx, slope, len(points), (min(gaps), max(gaps)))


COLUMNS = (
    "variant",
    "seeds",
    "spikes/100: model (law)",
    "measured",
    "collapses: model",
    "measured",
    "mismatch: model m",
    "measured",
    "staleness 0: model 0.5·f",
    "measured",
    "fit a + c·s^1.5: c (model 0.011)",
    "a",
    "s range",
)


def table_cells(rows: list[Comparison]) -> list[list[str]]:
    """The comparison as text cells in :data:`COLUMNS` order."""
    return [
        [
            r.variant,
            str(r.seeds),
            f"{r.predicted_spikes_per_100.text(1)} ({r.law_spikes_per_100:g})",
            r.measured_spikes_per_100.text(1),
            f"{r.predicted_collapses}/{r.seeds}",
            f"{r.measured_collapses}/{r.seeds}",
            r.predicted_mismatch.text(4),
            r.measured_mismatch.text(4),
            f"{r.predicted_fresh_mismatch:.4f}",
            r.measured_fresh_mismatch.text(4),
            "—" if r.fit is None else f"{r.fit.coefficient:.4f}",
            "—" if r.fit is None else f"{r.fit.intercept:.4f}",
            "—" if r.fit is None else f"{r.fit.s_range[0]:g}–{r.fit.s_range[1]:g} ({r.fit.points} steps)",
        ]
        for r in rows
    ]


def markdown(rows: list[Comparison], calibration: Calibration, speeds: list[SpeedUp], skipped: list[str]) -> str:
    """The comparison table and the floors' sources, then the speed-ups and what was skipped, as markdown."""

    def row(cells) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [row(COLUMNS), "|" + "---|" * len(COLUMNS), *(row(c) for c in table_cells(rows)), ""]
    sources = sorted({calibration.sources[f"floors.{k}"] for k in drift_model.FORMAT_KEYS})
    lines += [f"Floors f from: {'; '.join(sources)}.", "", f"The {speed_title()}:", ""]
    if speeds:
        lines += [row(SPEED_COLUMNS), "|" + "---|" * len(SPEED_COLUMNS), *(row(c) for c in speed_cells(speeds)), ""]
    lines += [f"- skipped: {line}" for line in skipped] or ["- none skipped"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SpeedUp:
    """The simulator's wall-clock for one variant's plan, asynchronous, and for synchronous BF16 (seconds)."""

    variant: str
    config: SimConfig
    seconds: tuple[float, float, float]  # the plan's rollout, train and weight-sync seconds
    wall_clock_seconds: float
    sync_bf16_wall_clock_seconds: float

    @property
    def speed(self) -> float:
        return self.sync_bf16_wall_clock_seconds / self.wall_clock_seconds


def speed_ups(path: Path, results: dict, calibration: Calibration) -> tuple[list[SpeedUp], list[str]]:
    """The speed-ups of the timed variants of ``results`` (read from ``path``, its step times loaded last
    into ``calibration``), in order of first appearance, and one line per variant skipped saying why."""
    variants, label = results.get("variants") or {}, source_label(path, results) + mixed_loads(results) + ": "
    speeds, skipped = [], []
    for name in dict.fromkeys(run["variant"] for run in results["runs"]):
        if not any(TIMED[0] in step for run in results["runs"] if run["variant"] == name for step in run["steps"]):
            skipped.append(f"{name}: no run of it records step times")
            continue
        if rollout_key(variants[name]) is None:
            skipped.append(
                f"{name}: its plan is none the step times are calibrated for (bf16, mxfp8, NVFP4's naive forward "
                "with or without 4/6): the simulator would run it on another variant's times"
            )
            continue
        config = sim_config(name, variants[name]).with_(max_staleness=ASYNC_STALENESS)
        names = (*step_names(config), *step_names(sync_bf16(config)))
        elsewhere = [n for n in names if not calibration.sources[n].startswith(label)]
        if elsewhere:
            skipped.append(f"{name}: the file times no run behind {', '.join(elsewhere)}")
            continue
        seconds = step_seconds(config, calibration)
        wall = build_timeline(config, *seconds).end_time
        speeds.append(SpeedUp(name, config, seconds, wall, sync_bf16_seconds(config, calibration)))
    return speeds, skipped


SPEED_COLUMNS = ("variant", "speed × sync BF16", "rollout s", "train s", "weight sync s", "wall-clock s",
                 "sync BF16 wall-clock s")  # fmt: skip


def speed_title() -> str:
    """What the speed-ups are, for the table's title."""
    c = SimConfig()
    return (
        f"simulated speed vs synchronous BF16, each plan on its own format's step times and weight-sync pause "
        f"from the file (max_staleness {ASYNC_STALENESS}, {c.num_samplers} samplers, batch {c.batch}, "
        f"{c.horizon} horizon, {c.steps} steps, seed {c.seed})"
    )


def speed_cells(speeds: list[SpeedUp]) -> list[list[str]]:
    """The speed-ups as text cells in :data:`SPEED_COLUMNS` order."""
    cells = []
    for s in speeds:
        walls = (s.wall_clock_seconds, s.sync_bf16_wall_clock_seconds)
        cells.append([s.variant, f"{s.speed:.2f}", *(f"{v:.4g}" for v in s.seconds), *(f"{w:.1f}" for w in walls)])
    return cells
