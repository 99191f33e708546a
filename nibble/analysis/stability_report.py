"""``nibble report stability``'s library: read a stability results JSON, summarise it per variant, plot it.

The results come from ``benchmarks/stability/`` (one run per variant × seed, one record per trainer
step); the event definitions (spikes, collapses) live in :mod:`nibble.analysis.stability_events`. Every number in
the table is the mean over seeds with the sample standard deviation across seeds beside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, stdev

from nibble.analysis.stability_events import COLLAPSE_DROP, collapse_step, judged_steps, spike_steps
from nibble.simulator.calibration_files import RepeatedKey, unique_keys
from nibble.simulator.stability_calibration import MARKER, PILOTS_FILE, PILOTS_MARKER

FINAL_WINDOW = 10  # "final reward" = mean batch reward over the last this-many steps

_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list"}
# Fields every record must hold: name -> (accepts null, expected kind).
_RUN_FIELDS = {
    "variant": (False, str),
    "seed": (False, int),
    "warm_start_accuracy": (False, float),
    "steps": (False, list),
}
_STEP_FIELDS = {
    "step": (False, int),
    "grad_norm": (True, float),
    "reward": (False, float),
    "eval_accuracy": (True, float),
    "logprob_abs_diff": (False, float),
    "fresh_logprob_abs_diff": (True, float),
    "skipped_updates": (False, int),
}
# Fields of steps recorded since the grid times its steps (benchmarks/stability/run.py STEP_SECONDS):
# checked where present, absent from older files.
_TIMING_FIELDS = {
    "generate_seconds": (False, float),
    "train_seconds": (False, float),
    "publish_seconds": (False, float),
    "eval_seconds": (True, float),
}
_ANY = (-math.inf, math.inf)
# Ranges of the numbers a step may hold, checked where the field is present and a number: name ->
# (low, high, finite). Rewards are the built-in tasks' ([0, 1]: nibble.tasks.matching, .reasoning, .addition;
# a custom reward function may return any finite number, see _reward_range); accuracies are fractions of
# the held-out problems; a grad norm may be NaN or inf (a skipped update) but never negative.
_STEP_RANGES = {
    "reward": (0.0, 1.0, True),
    "eval_accuracy": (0.0, 1.0, True),
    "logprob_abs_diff": (0.0, math.inf, True),
    "fresh_logprob_abs_diff": (0.0, math.inf, True),
    "staleness_mean": (0.0, math.inf, True),
    "grad_norm": (0.0, math.inf, False),
    "skipped_updates": (0, math.inf, True),
    **{name: (0.0, math.inf, True) for name in _TIMING_FIELDS},
}
# What other benchmarks' files are (so that one passed by mistake is named).
OTHER_BENCHMARKS = {
    PILOTS_MARKER: f"{PILOTS_FILE}, which holds the pilots' choice of learning rate and staleness and no runs",
    "mismatch": "a mismatch benchmark's record",
}


@dataclass(frozen=True)
class RunSummary:
    """One run's outcome under the fixed definitions."""

    variant: str
    seed: int
    steps: int
    spikes: int
    judged_steps: int
    collapse_step: int | None
    final_reward: float
    final_accuracy: float | None
    warm_start_accuracy: float
    logprob_abs_diff: float
    fresh_logprob_abs_diff: float | None
    skipped_steps: int

    @property
    def ends_below_threshold(self) -> bool:
        """The last evaluation is below ``warm start − COLLAPSE_DROP``: a fall too late to be judged a
        collapse (or a collapse that lasted), shown so that late falls are not hidden by the rule."""
        return self.final_accuracy is not None and self.final_accuracy < self.warm_start_accuracy - COLLAPSE_DROP

    @property
    def spikes_per_100(self) -> float:
        return 100.0 * self.spikes / self.judged_steps if self.judged_steps else 0.0


@dataclass(frozen=True)
class Spread:
    """Mean and sample standard deviation over seeds (``std`` is None with fewer than two values)."""

    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        kept = [v for v in values if v is not None and math.isfinite(v)]
        return cls(fmean(kept) if kept else None, stdev(kept) if len(kept) > 1 else None, len(kept))

    def text(self, digits: int = 3) -> str:
        if self.mean is None:
            return "—"
        return f"{self.mean:.{digits}f}" + ("" if self.std is None else f" ± {self.std:.{digits}f}")


@dataclass(frozen=True)
class VariantRow:
    """The table row of one variant."""

    variant: str
    seeds: int
    spikes_per_100: Spread
    collapses: int
    ends_below: int
    final_reward: Spread
    final_accuracy: Spread
    logprob_abs_diff: Spread
    fresh_logprob_abs_diff: Spread
    skipped_steps: int


def load_results(path: Path) -> dict:
    """Read and validate a stability results JSON.

    Raises:
        ValueError: naming the file and, where it applies, the record and field: a missing or unreadable
            file, malformed JSON, another benchmark's file, no runs, a missing field or one of the wrong
            type; and as :func:`check_values` (numbers out of range, repeated runs, misnumbered steps).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: results file not found")
    try:
        data = json.loads(path.read_text(), object_pairs_hook=unique_keys)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: malformed JSON ({exc})") from None
    except RepeatedKey as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be an object with a 'runs' list")
    check_marker(path, data)
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{path}: field 'runs' must be a non-empty list")
    for i, run in enumerate(runs):
        _check_fields(path, f"runs[{i}]", run, _RUN_FIELDS)
        if not run["steps"]:
            raise ValueError(f"{path}: runs[{i}].steps is empty")
        for j, step in enumerate(run["steps"]):
            _check_fields(path, f"runs[{i}].steps[{j}]", step, _STEP_FIELDS)
            timing = {name: kind for name, kind in _TIMING_FIELDS.items() if name in step}
            _check_fields(path, f"runs[{i}].steps[{j}]", step, timing)
    check_values(path, data)
    return data


def check_marker(path: Path, data: dict) -> None:
    """Refuse another benchmark's file (a ``"benchmark"`` other than ``"stability"``; files may omit it).

    Raises:
        ValueError: naming ``path`` and what the file is instead.
    """
    kind = data.get(MARKER[0], MARKER[1])
    if kind != MARKER[1]:
        what = OTHER_BENCHMARKS.get(kind, f"the {kind!r} benchmark's record") if isinstance(kind, str) else None
        what = what or f"field 'benchmark' = {kind!r}"
        raise ValueError(f'{path}: {what}, not a stability grid\'s results file ("benchmark": "stability")')


def check_values(path: Path, data: dict) -> None:
    """Refuse numbers no run can have recorded, in the runs of a parsed results file: each checked where
    present and a number (type and presence are :func:`load_results`'s to check).

    Raises:
        ValueError: naming ``path``, the run (index, variant and seed) and the step: a run repeating an
            earlier run's variant and seed; a step number that is not positive or not above the previous
            step's; a NaN, infinite or out-of-range number (:data:`_STEP_RANGES`; ``staleness_mean`` at most
            the setting's ``max_staleness``); a ``warm_start_accuracy`` outside [0, 1].
    """
    ranges = {**_STEP_RANGES, "reward": _reward_range(data), "staleness_mean": _staleness_range(path, data)}
    seen: dict[tuple, int] = {}
    for i, run in enumerate(data.get("runs") or []):
        if not isinstance(run, dict):
            continue
        where = f"{path}: runs[{i}] (variant {run.get('variant')!r}, seed {run.get('seed')!r})"
        key = (run.get("variant"), run.get("seed"))
        if key in seen and _is_key(key):
            raise ValueError(f"{where} repeats runs[{seen[key]}]: one run per variant and seed")
        seen.setdefault(key, i)
        _check_number(f"{where}: warm_start_accuracy", run.get("warm_start_accuracy"), (0.0, 1.0, True))
        steps = run.get("steps") if isinstance(run.get("steps"), list) else []
        previous = 0
        for j, step in enumerate(steps):
            if not isinstance(step, dict):
                continue
            number = step.get("step")
            at = f"{where}, steps[{j}]" + (f" (step {number})" if _is_number(number) else "")
            if isinstance(number, int) and not isinstance(number, bool):
                if number < 1:
                    raise ValueError(f"{at}: step {number}: step numbers start at 1")
                if number <= previous:
                    what = "repeats" if number == previous else "comes after"
                    raise ValueError(f"{at}: step {number} {what} step {previous}: steps must increase")
                previous = number
            for name, bounds in ranges.items():
                _check_number(f"{at}: {name}", step.get(name), bounds)


def _is_key(key: tuple) -> bool:
    return all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in key)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(where: str, value: object, bounds: tuple[float, float, bool]) -> None:
    """Nothing for a value that is not a number (None, or a type the field checks refuse)."""
    if not _is_number(value):
        return
    low, high, finite = bounds
    try:
        number = float(value)
    except OverflowError:  # an integer past the float range: JSON allows it
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number) and not finite:
        return
    if math.isnan(number) or (finite and math.isinf(number)):
        raise ValueError(f"{where} = {value!r}: expected a finite number{_range_text(low, high)}")
    if not low <= number <= high:
        raise ValueError(f"{where} = {value!r}: expected a number{_range_text(low, high)}")


def _range_text(low: float, high: float) -> str:
    if (low, high) == _ANY:
        return ""
    return f" ≥ {low:g}" if high == math.inf else f" in [{low:g}, {high:g}]"


def _reward_range(data: dict) -> tuple[float, float, bool]:
    """[0, 1], or any finite number where the file's task scores with a custom function (``module:function``)."""
    task = data.get("task")
    options = task.get("options") if isinstance(task, dict) else None
    reward = options.get("reward") if isinstance(options, dict) else None
    return (*_ANY, True) if isinstance(reward, str) and ":" in reward else (0.0, 1.0, True)


def _staleness_range(path: Path, data: dict) -> tuple[float, float, bool]:
    """``[0, max_staleness]`` where the file's setting records it (a batch's mean gap cannot exceed it)."""
    setting = data.get("setting")
    bound = setting.get("max_staleness") if isinstance(setting, dict) else None
    if bound is None:
        return _STEP_RANGES["staleness_mean"]
    _check_number(f"{path}: setting.max_staleness", bound, (0, math.inf, True))
    return (0.0, float(bound), True) if _is_number(bound) else _STEP_RANGES["staleness_mean"]


def _check_fields(path: Path, where: str, record, fields: dict) -> None:
    if not isinstance(record, dict):
        raise ValueError(f"{path}: {where} must be an object")
    for name, (nullable, kind) in fields.items():
        if name not in record:
            raise ValueError(f"{path}: {where}: missing field '{name}'")
        value = record[name]
        if value is None and nullable:
            continue
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise ValueError(f"{path}: {where}.{name} = {value!r}: expected {_KIND_NAMES[kind]}")


def summarize_run(run: dict) -> RunSummary:
    """Spikes, collapse and end-of-run numbers of one validated run record."""
    steps = run["steps"]
    norms = [s["grad_norm"] for s in steps]
    evals = [(s["step"], s["eval_accuracy"]) for s in steps if s["eval_accuracy"] is not None]
    fresh = [s["fresh_logprob_abs_diff"] for s in steps if s["fresh_logprob_abs_diff"] is not None]
    return RunSummary(
        variant=run["variant"],
        seed=run["seed"],
        steps=len(steps),
        spikes=len(spike_steps(norms)),
        judged_steps=judged_steps(norms),
        collapse_step=collapse_step(evals, run["warm_start_accuracy"], steps[-1]["step"]),
        final_reward=fmean(s["reward"] for s in steps[-FINAL_WINDOW:]),
        final_accuracy=evals[-1][1] if evals else None,
        warm_start_accuracy=run["warm_start_accuracy"],
        logprob_abs_diff=fmean(s["logprob_abs_diff"] for s in steps),
        fresh_logprob_abs_diff=fmean(fresh) if fresh else None,
        skipped_steps=sum(s["skipped_updates"] for s in steps),
    )


def runs_by_variant(results: dict) -> dict[str, list[RunSummary]]:
    """Each run's summary, by variant, in the order variants first appear in ``results['runs']``."""
    by_variant: dict[str, list[RunSummary]] = {}
    for run in results["runs"]:
        summary = summarize_run(run)
        by_variant.setdefault(summary.variant, []).append(summary)
    return by_variant


def variant_rows(results: dict) -> list[VariantRow]:
    """One row per variant, in the order variants first appear in ``results['runs']``."""
    return [
        VariantRow(
            variant=name,
            seeds=len(runs),
            spikes_per_100=Spread.of([r.spikes_per_100 for r in runs]),
            collapses=sum(r.collapse_step is not None for r in runs),
            ends_below=sum(r.ends_below_threshold for r in runs),
            final_reward=Spread.of([r.final_reward for r in runs]),
            final_accuracy=Spread.of([r.final_accuracy for r in runs]),
            logprob_abs_diff=Spread.of([r.logprob_abs_diff for r in runs]),
            fresh_logprob_abs_diff=Spread.of([r.fresh_logprob_abs_diff for r in runs]),
            skipped_steps=sum(r.skipped_steps for r in runs),
        )
        for name, runs in runs_by_variant(results).items()
    ]


COLUMNS = (
    "variant",
    "seeds",
    "spikes / 100 steps",
    "collapses",
    "ends below warm − 0.1",
    "final reward",
    "final held-out acc.",
    "mean |Δlogprob|",
    "… staleness 0",
    "skipped steps",
)


def table_cells(rows: list[VariantRow]) -> list[list[str]]:
    """The table as text cells, one list per row in :data:`COLUMNS` order."""
    return [
        [
            r.variant,
            str(r.seeds),
            r.spikes_per_100.text(2),
            f"{r.collapses}/{r.seeds}",
            f"{r.ends_below}/{r.seeds}",
            r.final_reward.text(3),
            r.final_accuracy.text(3),
            r.logprob_abs_diff.text(4),
            r.fresh_logprob_abs_diff.text(4),
            str(r.skipped_steps),
        ]
        for r in rows
    ]


def markdown_table(rows: list[VariantRow]) -> str:
    """A GitHub-markdown table of :func:`table_cells` (mean ± standard deviation across seeds)."""

    def row(cells) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"  # "|Δlogprob|" is not a cell edge

    lines = [row(COLUMNS), "|" + "---|" * len(COLUMNS)]
    lines += [row(cells) for cells in table_cells(rows)]
    return "\n".join(lines) + "\n"


# Buckets of a step's mean staleness (the mean over its generation batches of the versions between the
# sampler's policy and the trainer's): (label, low, high], the first exactly 0.
STALENESS_BUCKETS = (("0", -math.inf, 0.0), ("(0, 1]", 0.0, 1.0), ("(1, 2]", 1.0, 2.0), ("> 2", 2.0, math.inf))


def staleness_table(results: dict) -> str:
    """Mean |Δlogprob| per variant by the staleness of its steps (:data:`STALENESS_BUCKETS`; every seed's
    steps pooled, each cell with its number of steps), as a GitHub-markdown table; steps that do not
    record ``staleness_mean`` (files before it was recorded) are left out, and a variant with none shows
    dashes."""
    header = ["variant", *(f"staleness {label}" for label, _, _ in STALENESS_BUCKETS)]
    caption = "Mean \\|Δlogprob\\| by the mean staleness of a step's batches (steps in each cell, seeds pooled)."
    lines = [caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_variant: dict[str, list[dict]] = {}
    for run in results["runs"]:
        by_variant.setdefault(run["variant"], []).extend(s for s in run["steps"] if _is_number(s.get("staleness_mean")))
    for variant, steps in by_variant.items():
        cells = []
        for _, low, high in STALENESS_BUCKETS:
            values = [s["logprob_abs_diff"] for s in steps if low < s["staleness_mean"] <= high]
            cells.append(f"{fmean(values):.4f} ({len(values)})" if values else "—")
        lines.append("| " + " | ".join([variant, *cells]) + " |")
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> list[Path]:
    """``grad_norm.png``, ``reward.png`` and ``accuracy.png`` in ``out``: one panel per variant, seeds
    overlaid; spikes marked ×, steps without learning signal (norm 0) left as gaps, the collapse
    threshold dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_variant: dict[str, list[dict]] = {}
    for run in results["runs"]:
        by_variant.setdefault(run["variant"], []).append(run)
    figures = {
        "grad_norm.png": ("grad norm before clipping (log)", _draw_grad_norm),
        "reward.png": ("batch reward (5-step mean)", _draw_reward),
        "accuracy.png": ("held-out accuracy", _draw_accuracy),
    }
    written = []
    for name, (ylabel, draw) in figures.items():
        ncols = min(4, len(by_variant))
        nrows = math.ceil(len(by_variant) / ncols)
        size = (3.6 * ncols, 2.6 * nrows)
        fig, axes = plt.subplots(nrows, ncols, figsize=size, sharex=True, sharey=True, squeeze=False)
        for ax, (variant, runs) in zip(axes.flat, by_variant.items(), strict=False):
            for index, run in enumerate(runs):
                draw(ax, run, f"C{index % 10}")
            ax.set_title(variant, fontsize=9)
            ax.grid(alpha=0.3)
        for ax in axes.flat[len(by_variant) :]:
            ax.set_visible(False)
        for ax in axes[-1]:
            ax.set_xlabel("trainer step")
        for ax in axes[:, 0]:
            ax.set_ylabel(ylabel, fontsize=8)
        fig.tight_layout()
        fig.savefig(Path(out) / name, dpi=100)
        plt.close(fig)
        written.append(Path(out) / name)
    return written


def _draw_grad_norm(ax, run: dict, color: str) -> None:
    steps = [s["step"] for s in run["steps"]]
    norms = [s["grad_norm"] if s["grad_norm"] is not None else math.nan for s in run["steps"]]
    # zero norms (no learning signal) cannot sit on a log axis: they are gaps, as they are for the spike rule
    shown = [n if n > 0 else math.nan for n in norms]
    ax.plot(steps, shown, ".-", color=color, lw=0.7, ms=2, alpha=0.8)
    spikes = [i for i in spike_steps(norms) if math.isfinite(norms[i])]
    ax.plot([steps[i] for i in spikes], [norms[i] for i in spikes], "x", color=color, ms=6)
    ax.set_yscale("log")


def _draw_reward(ax, run: dict, color: str) -> None:
    """Raw batch reward faint, its trailing 5-step mean bold (one batch of 32 responses is noisy)."""
    steps, rewards = [s["step"] for s in run["steps"]], [s["reward"] for s in run["steps"]]
    smooth = [fmean(rewards[max(0, i - 4) : i + 1]) for i in range(len(rewards))]
    ax.plot(steps, rewards, color=color, lw=0.5, alpha=0.25)
    ax.plot(steps, smooth, color=color, lw=1.2, alpha=0.9)


def _draw_accuracy(ax, run: dict, color: str) -> None:
    points = [(0, run["warm_start_accuracy"])]
    points += [(s["step"], s["eval_accuracy"]) for s in run["steps"] if s["eval_accuracy"] is not None]
    ax.plot(*zip(*points, strict=True), ".-", color=color, lw=0.8, ms=3, alpha=0.8)
    ax.axhline(run["warm_start_accuracy"] - COLLAPSE_DROP, color=color, ls="--", lw=0.6, alpha=0.5)
