"""``python -m benchmarks.stability``: run (part of) the grid and record it (see the package docstring)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from statistics import fmean

from benchmarks.arguments import integer_at_least
from benchmarks.stability.results import ROOT, earlier_part, results_document, save
from benchmarks.stability.run import PUBLISH_QUANTIZE, run_grid
from benchmarks.stability.setting import Setting, Source, ensure_warm_start, from_config
from benchmarks.stability.variants import VARIANTS
from nibble.analysis import stability_events


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stability", description=__doc__)
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--checkpoint", type=Path, help="an SFT warm start (default runs/warm_start, made if missing)")
    start.add_argument("--config", type=Path, help="a run config: its model, task, plan scope, numbers and device")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=integer_at_least(1), default=Setting.steps)
    parser.add_argument("--eval-every", type=integer_at_least(1), default=None, help="default: the setting's")
    parser.add_argument("--workers", type=integer_at_least(1), default=1, help="CPU processes (one torch thread each)")
    parser.add_argument("--devices", nargs="+", default=None, help="one run at a time on each (e.g. cuda:0 cuda:1)")
    parser.add_argument("--append", action="store_true", help="add to --out the runs it does not hold yet")
    parser.add_argument(
        "--max-runs", type=integer_at_least(1), default=None,
        help="run only the first N runs still missing, in grid order (a part that fits the time you have)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stability.json")
    return parser


def main(argv: list[str] | None = None) -> None:
    from benchmarks.machine import describe

    parser = _parser()
    args = parser.parse_args(argv)
    command = shlex.join([".venv/bin/python", "-m", "benchmarks.stability", *(sys.argv[1:] if argv is None else argv)])
    variants, seeds = list(dict.fromkeys(args.variants)), list(dict.fromkeys(args.seeds))
    try:  # everything a user can get wrong is refused here, before any minutes of work
        if args.config is not None:
            source, setting = from_config(args.config, args.steps, args.eval_every, args.devices)
        else:
            checkpoint = args.checkpoint or ROOT / "runs" / "warm_start"
            source = Source(checkpoint, devices=tuple(args.devices or ["cpu"]))
            setting = Setting(steps=args.steps, eval_every=args.eval_every or Setting.eval_every)
        if args.out.exists() and not args.append:
            raise ValueError(f"--out {args.out} exists: pass --append to add runs to it, or another --out")
        if (args.out.exists() and not args.out.is_file()) or (
            args.out.parent.exists() and not args.out.parent.is_dir()
        ):
            raise ValueError(f"--out {args.out}: not a file in a directory")
        earlier, parts = earlier_part(args.out, results_document([], setting, source, command, 0.0))
        source.check_devices()
        if args.config is None:
            ensure_warm_start(source.checkpoint)
        source.check_model()
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    started = time.time()
    machine = {
        **describe(),
        "workers": args.workers,
        "devices": list(source.devices),
        "publish_quantize": PUBLISH_QUANTIZE,
    }
    done = list(earlier)

    def record(new_runs: list[dict]) -> None:
        part = {"command": command, "machine": machine, "wall_seconds": time.time() - started,
                "runs": [[r["variant"], r["seed"]] for r in new_runs]}  # fmt: skip
        document = results_document(earlier + new_runs, setting, source, command, part["wall_seconds"])
        save(args.out, {**document, "machine": machine, "parts": [*parts, part]})

    def progress(run: dict, finished: int, total: int) -> None:
        done.append(run)
        norms = [s["grad_norm"] for s in run["steps"]]
        accs = [s["eval_accuracy"] for s in run["steps"] if s["eval_accuracy"] is not None]
        print(
            f"[{finished}/{total}] {time.time() - started:7.0f}s {run['variant']:16s} seed {run['seed']} "
            f"{run['device']} {run['wall_seconds']:5.0f}s spikes {len(stability_events.spike_steps(norms))} "
            f"acc {run['warm_start_accuracy']:.3f}->{accs[-1]:.3f} "
            f"reward(last10) {fmean(s['reward'] for s in run['steps'][-10:]):.3f} "
            f"s/step gen {fmean(s['generate_seconds'] for s in run['steps']):.2f} "
            f"train {fmean(s['train_seconds'] for s in run['steps']):.2f}",
            flush=True,
        )
        record(done[len(earlier) :])  # after every run: a stopped grid keeps what it did

    skip = {(r["variant"], r["seed"]) for r in earlier}
    if all((v, s) in skip for s in seeds for v in variants):  # an empty part would only overwrite the record
        print(f"nothing to run: {args.out} holds all {len(seeds) * len(variants)} runs of this grid (left as it was)")
        return
    try:
        runs = run_grid(
            source, variants, seeds, setting, workers=args.workers, skip=skip, max_runs=args.max_runs, on_run=progress
        )
    except KeyboardInterrupt:
        parser.exit(130, f"stopped: {len(done) - len(earlier)} new runs kept in {args.out}\n")
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    record(runs)
    print(f"recorded {len(runs)} new runs ({len(earlier) + len(runs)} in all) in {args.out}")


if __name__ == "__main__":
    main()
