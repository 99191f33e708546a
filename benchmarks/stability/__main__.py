"""``python -m benchmarks.stability``: run (part of) the grid and record it (see the package docstring)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from statistics import fmean

from benchmarks.stability.results import ROOT, earlier_runs, results_document, save
from benchmarks.stability.run import run_grid
from benchmarks.stability.setting import Setting, Source, ensure_warm_start, from_config
from benchmarks.stability.variants import VARIANTS
from nibble.analysis import stability_events


def main(argv: list[str] | None = None) -> None:
    from benchmarks.machine import describe

    parser = argparse.ArgumentParser(prog="python -m benchmarks.stability", description=__doc__)
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--checkpoint", type=Path, help="an SFT warm start (default runs/warm_start, made if missing)")
    start.add_argument("--config", type=Path, help="a run config: its model, task, plan scope, numbers and device")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=Setting.steps)
    parser.add_argument("--eval-every", type=int, default=None, help="default: the setting's")
    parser.add_argument("--workers", type=int, default=1, help="CPU processes (one torch thread each)")
    parser.add_argument("--devices", nargs="+", default=None, help="one run at a time on each (e.g. cuda:0 cuda:1)")
    parser.add_argument("--append", action="store_true", help="add to --out the runs it does not hold yet")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stability.json")
    args = parser.parse_args(argv)
    command = shlex.join([".venv/bin/python", "-m", "benchmarks.stability", *(sys.argv[1:] if argv is None else argv)])
    try:
        if args.config is not None:
            source, setting = from_config(args.config, args.steps, args.eval_every, args.devices)
        else:
            checkpoint = args.checkpoint or ROOT / "runs" / "warm_start"
            source = Source(checkpoint, devices=tuple(args.devices or ["cpu"]))
            setting = Setting(steps=args.steps, eval_every=args.eval_every or Setting.eval_every)
            ensure_warm_start(checkpoint)
        if args.out.exists() and not args.append:
            raise ValueError(f"--out {args.out} exists: pass --append to add runs to it, or another --out")
        earlier = earlier_runs(args.out, results_document([], setting, source, command, 0.0)) if args.append else []
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    started = time.time()
    machine = {**describe(), "workers": args.workers, "devices": list(source.devices)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = list(earlier)
    skip = {(r["variant"], r["seed"]) for r in earlier}

    def progress(run: dict, finished: int, total: int) -> None:
        done.append(run)
        norms = [s["grad_norm"] for s in run["steps"]]
        accs = [s["eval_accuracy"] for s in run["steps"] if s["eval_accuracy"] is not None]
        print(
            f"[{finished}/{total}] {time.time() - started:7.0f}s {run['variant']:16s} seed {run['seed']} "
            f"{run['device']} {run['wall_seconds']:5.0f}s spikes {len(stability_events.spike_steps(norms))} "
            f"acc {run['warm_start_accuracy']:.3f}->{accs[-1]:.3f} "
            f"reward(last10) {fmean(s['reward'] for s in run['steps'][-10:]):.3f}",
            flush=True,
        )
        document = results_document(done, setting, source, command, time.time() - started)
        save(args.out, {**document, "machine": machine})  # after every run: a stopped grid keeps what it did

    runs = run_grid(source, args.variants, args.seeds, setting, workers=args.workers, skip=skip, on_run=progress)
    document = results_document(earlier + runs, setting, source, command, time.time() - started)
    save(args.out, {**document, "machine": machine})
    print(f"recorded {len(runs)} new runs ({len(earlier) + len(runs)} in all) in {args.out}")


if __name__ == "__main__":
    main()
