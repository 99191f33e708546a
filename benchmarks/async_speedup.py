"""Asynchronous vs synchronous RL on this machine: the same config and number of trainer steps with
``max_staleness: 0`` (synchronous; samplers generate one batch per version) and ``2``.

Records wall-clock, final reward, held-out accuracy, trainer utilisation (1 − idle share) and sampler
tokens/s per run, and the async/sync wall-clock ratio, in benchmarks/results/async_speedup.json.

    .venv/bin/python -m benchmarks.async_speedup --checkpoint runs/warm_start [--steps 100] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import fmean
from tempfile import TemporaryDirectory

from benchmarks.machine import describe
from nibble.config import RunConfig, load
from nibble.launcher import launch
from nibble.run_report import summarize

ROOT = Path(__file__).resolve().parents[1]


def one_run(checkpoint: Path, steps: int, seed: int, max_staleness: int, samplers: int) -> dict:
    data = load(ROOT / "configs" / "default.yaml").model_dump(mode="json")
    data["seed"] = seed
    data["num_samplers"] = samplers
    data["model"]["checkpoint"] = str(checkpoint)
    data["trainer"].update(total_steps=steps, max_staleness=max_staleness, eval_every=steps)
    config = RunConfig.model_validate(data)
    with TemporaryDirectory() as tmp:
        out = Path(tmp)
        started = time.time()
        effective = launch(config, out)
        summary = summarize(out, effective, time.time() - started)
    keys = (
        "wall_seconds",
        "final_reward",
        "eval_accuracy_after",
        "mean_staleness",
        "sampler_tokens_per_second",
        "trainer_idle_seconds",
        "stale_dropped",
    )
    record = {k: summary[k] for k in keys}
    record["trainer_utilisation"] = 1 - summary["trainer_idle_seconds"] / summary["wall_seconds"]
    record.update(seed=seed, max_staleness=max_staleness, num_samplers=samplers)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--samplers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "async_speedup.json")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        for staleness in (0, 2):
            runs.append(one_run(args.checkpoint, args.steps, seed, staleness, 2))
            print(json.dumps(runs[-1]))
    for samplers in args.samplers:
        if samplers != 2:
            runs.append(one_run(args.checkpoint, args.steps, args.seeds[0], 2, samplers))
            print(json.dumps(runs[-1]))
    sync = [r["wall_seconds"] for r in runs if r["max_staleness"] == 0]
    asyn = [r["wall_seconds"] for r in runs if r["max_staleness"] == 2 and r["num_samplers"] == 2]
    result = {
        "benchmark": "async_speedup",
        "steps": args.steps,
        "machine": describe(),
        "speedup_async_over_sync": fmean(sync) / fmean(asyn),
        "target": 1.2,
        "runs": runs,
    }
    print(f"async (max_staleness 2) is {result['speedup_async_over_sync']:.2f}x faster than sync (target 1.2x)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
