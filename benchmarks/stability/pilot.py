"""Short pilots that choose the grid's learning rate and staleness before the grid runs (issue 20: "chosen so
the naive variant is stressed; say how they were chosen, before the grid").

Each pilot is a few steps of ``nvfp4_naive`` and ``bf16`` (the grid's own :func:`run_one`, same source and
setting but for the learning rate and ``max_staleness``) at one point of a learning rate × staleness grid;
pilots run concurrently, several per GPU if ``--devices`` names a GPU more than once (a 135 M model leaves
an H200 mostly idle). The choice rule is fixed here, before any pilot ran:

1. a point is *usable* when ``bf16`` learns there (its mean reward over the pilot's second half is not
   below its first half's by more than :data:`REWARD_TOLERANCE`) and neither variant has a non-finite norm
   (a skipped update would make every grid run of that point a spike run from the start);
2. among usable points, the one where ``nvfp4_naive`` is furthest from ``bf16``: the largest ratio of its
   maximum grad norm over its median (spikiness) to ``bf16``'s, ties broken by the larger ratio of their
   mean train–rollout |Δlogprob| (the mismatch that drives drift);
3. no usable point: the pilot says so and chooses nothing (the grid must not run on a setting where BF16
   itself does not learn). A run that fails (out of GPU memory, say) makes its point unusable, recorded
   with the error; the other pilots go on.

    .venv/bin/python -m benchmarks.stability.pilot --config configs/smollm2-gpu.yaml --steps 20 \
        --learning-rates 1e-5 3e-5 1e-4 --staleness 2 4 --devices cuda:0 cuda:0 cuda:0 cuda:0 \
        --out benchmarks/results/stability_smollm2_pilots.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from statistics import fmean, median

from benchmarks.arguments import integer_at_least
from benchmarks.stability.results import ROOT, check_writable
from benchmarks.stability.run import run_on_free_device
from benchmarks.stability.setting import from_config
from nibble.simulator.stability_calibration import PILOTS_MARKER

PILOT_VARIANTS = ("nvfp4_naive", "bf16")
REWARD_TOLERANCE = 0.02


@dataclasses.dataclass(frozen=True)
class Point:
    """One pilot point: AdamW learning rate and the oldest policy version a batch may be sampled with."""

    learning_rate: float
    max_staleness: int


def summarize(run: dict) -> dict:
    """A pilot run's numbers for the choice rule: grad-norm max/median (finite, non-zero norms), whether a
    norm was non-finite, mean |Δlogprob| and rewards of both halves, and seconds per step."""
    steps = run["steps"]
    norms = [s["grad_norm"] for s in steps]
    finite = [n for n in norms if n is not None and n == n and abs(n) != float("inf") and n > 0]
    half = len(steps) // 2
    return {
        "grad_norm_max_over_median": max(finite) / median(finite) if finite else None,
        "non_finite_norms": sum(1 for n in norms if n is None or n != n or abs(n) == float("inf")),
        "logprob_abs_diff_mean": fmean(s["logprob_abs_diff"] for s in steps),
        "reward_first_half": fmean(s["reward"] for s in steps[:half]) if half else None,
        "reward_second_half": fmean(s["reward"] for s in steps[half:]),
        "seconds_per_step": run["wall_seconds"] / len(steps),
    }


def choose(points: dict[Point, dict[str, dict]]) -> tuple[Point | None, dict[Point, str]]:
    """The rule of the module docstring over ``{point: {variant: summarize(run)}}``: the chosen point (or
    ``None``) and a one-line verdict per point."""
    verdicts, usable = {}, []
    for point, by_variant in points.items():
        naive, bf16 = by_variant["nvfp4_naive"], by_variant["bf16"]
        failed = [f"{v}: {r['error']}" for v, r in by_variant.items() if "error" in r]
        if failed:
            verdicts[point] = f"not usable: a run failed ({'; '.join(failed)})"
        elif naive["non_finite_norms"] or bf16["non_finite_norms"]:
            verdicts[point] = "not usable: a non-finite grad norm"
        elif bf16["reward_first_half"] is not None and (
            bf16["reward_second_half"] < bf16["reward_first_half"] - REWARD_TOLERANCE
        ):
            verdicts[point] = "not usable: bf16's reward falls"
        elif naive["grad_norm_max_over_median"] is None or bf16["grad_norm_max_over_median"] is None:
            verdicts[point] = "not usable: no learning signal"
        else:
            spikiness = naive["grad_norm_max_over_median"] / bf16["grad_norm_max_over_median"]
            mismatch = naive["logprob_abs_diff_mean"] / max(bf16["logprob_abs_diff_mean"], 1e-12)
            usable.append(((spikiness, mismatch), point))
            verdicts[point] = f"usable: naive/bf16 spikiness {spikiness:.2f}, mismatch {mismatch:.2f}"
    chosen = max(usable, key=lambda item: item[0])[1] if usable else None
    return chosen, verdicts


def _learning_rate(text: str) -> float:
    """An argparse type: a finite number > 0 (``nan``, ``inf`` and ``0`` parse as floats but train nothing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stability.pilot", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the grid's run config")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rates", type=_learning_rate, nargs="+", required=True, help="each finite, > 0")
    parser.add_argument("--staleness", type=integer_at_least(0), nargs="+", required=True, help="each an integer ≥ 0")
    parser.add_argument("--devices", nargs="+", required=True, help="one concurrent pilot per entry")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stability_pilots.json")
    return parser


def main(argv: list[str] | None = None) -> None:
    from benchmarks.machine import describe, write_record

    parser = _parser()
    args = parser.parse_args(argv)
    try:  # everything a user can get wrong is refused here, before any pilot runs
        if args.steps < 4:
            raise ValueError(f"--steps {args.steps}: a pilot needs at least 4 steps (two halves of two)")
        if args.out.exists():
            raise ValueError(f"--out {args.out} exists: pilots never overwrite a record")
        if args.out.parent.exists() and not args.out.parent.is_dir():
            raise ValueError(f"--out {args.out}: not a file in a directory")
        source, base = from_config(args.config, args.steps, args.steps, args.devices)
        source.check_devices()
        source.check_model()
        check_writable(args.out)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    points = [Point(lr, s) for lr in dict.fromkeys(args.learning_rates) for s in dict.fromkeys(args.staleness)]
    settings = {
        p: dataclasses.replace(base, learning_rate=p.learning_rate, max_staleness=p.max_staleness) for p in points
    }
    if source.task is not None and "eval_size" in source.task.get("options", {}):
        # pilots judge grad norms, mismatch and reward; the held-out accuracy only costs time here
        source = dataclasses.replace(
            source, task={**source.task, "options": {**source.task["options"], "eval_size": 16}}
        )
    started = time.time()
    summaries: dict[Point, dict[str, dict]] = {p: {} for p in points}

    def record(final: bool = False) -> tuple[Point | None, dict[Point, str]]:
        """Written after every run: a pilot stopped at a time limit keeps what finished."""
        complete = {p: v for p, v in summaries.items() if len(v) == len(PILOT_VARIANTS)}
        chosen, verdicts = choose(complete)
        document = {
            "benchmark": PILOTS_MARKER,
            "command": " ".join([".venv/bin/python", "-m", "benchmarks.stability.pilot", *(argv or sys.argv[1:])]),
            "machine": describe(),
            "config": str(args.config),
            "setting": dataclasses.asdict(base),
            "rule": __doc__.split("The choice rule is fixed here, before any pilot ran:")[1]
            .split("    .venv")[0]
            .strip(),
            "points": [
                {**dataclasses.asdict(p), "verdict": verdicts.get(p, "unfinished"), "variants": summaries[p]}
                for p in points
            ],
            "chosen": dataclasses.asdict(chosen) if chosen else None,
            "wall_seconds": time.time() - started,
        }
        write_record(args.out, document, indent=1, announce=final)
        return chosen, verdicts

    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(len(source.devices), mp_context=context) as pool:
        free = manager.Queue()
        for device in source.devices:
            free.put(device)
        futures = {
            pool.submit(run_on_free_device, free, source, variant, args.seed, settings[p]): (p, variant)
            for p in points
            for variant in PILOT_VARIANTS
        }
        for future in as_completed(futures):
            point, variant = futures[future]
            try:
                summaries[point][variant] = summarize(future.result())
            except Exception as exc:  # one failed run (out of GPU memory, say) must not lose the others
                summaries[point][variant] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            print(f"{time.time() - started:6.0f}s lr {point.learning_rate:g} staleness {point.max_staleness} "
                  f"{variant}: {json.dumps(summaries[point][variant])}", flush=True)  # fmt: skip
            record()
    chosen, verdicts = record(final=True)
    for point in points:
        print(f"lr {point.learning_rate:g} staleness {point.max_staleness}: {verdicts[point]}")
    print(f"chosen: {dataclasses.asdict(chosen) if chosen else 'none (no usable point)'}")


if __name__ == "__main__":
    main()
