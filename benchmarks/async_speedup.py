"""Asynchronous vs synchronous RL on a task with heavy-tailed response lengths, on this machine.

The same run — configs/default.yaml's recipe (NVFP4 rollouts, 8 groups of 8 per trainer step) on
``addition_heavy_tail`` (operand lengths drawn from a power law over 1..24 digits, so the median
answer has 2 digits and one in ~17 has 12 or more) — is made with ``max_staleness: 0`` (synchronous:
samplers generate exactly one batch per version, the trainer waits on the batch's longest response)
and ``max_staleness: 2`` (samplers run ahead by up to two versions), for each seed with 2 samplers,
then with 1 and 4 samplers (seed 0, both modes). Each run records wall-clock, trainer utilisation
(1 − the share of wall-clock the trainer waited on the stream), sampler tokens/s, mean response
length, final reward and held-out accuracy; the result is the sync/async wall-clock ratio (target
≥ 1.2×), in benchmarks/results/async_speedup.json with the machine it ran on.

Reproduce (on an otherwise idle machine; ≈ 15 minutes on 2 cores, the warm start included):

    .venv/bin/python -m benchmarks.async_speedup

The warm start (``--checkpoint``, default runs/warm_start_heavy_tail) is trained on the task first
when missing (300 steps of ``nibble sft``, about a minute). A quick check of the
machinery: ``--steps 10 --seeds 0 --samplers 2 --out /tmp/async.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import fmean
from tempfile import TemporaryDirectory

from benchmarks.machine import describe, out_problem, write_record
from benchmarks.options import AddUp, non_negative, positive
from nibble.analysis.run_report import read_lines, summarize
from nibble.config import RunConfig, load
from nibble.launcher import launch
from nibble.rundir import RunRecord

ROOT = Path(__file__).resolve().parents[1]
TASK = {"name": "addition_heavy_tail", "options": {"digits": 24, "tail": 1.0}}
TARGET = 1.2


def ensure_warm_start(checkpoint: Path, seed: int = 0, steps: int = 300) -> None:
    """Train the tiny model on :data:`TASK` for ``steps`` steps unless ``checkpoint`` exists. What the
    comparison needs is a policy that answers with about the right number of digits (so its response
    lengths follow the task's tail), not a given accuracy: a fixed budget keeps its cost known."""
    if (checkpoint / "config.json").is_file():
        return
    import torch

    from nibble.tasks import get_task
    from nibble.warmstart.sft import save_warm_start, train_sft

    torch.set_num_threads(1)  # more threads than idle cores slows training down many times
    with get_task(TASK["name"], **TASK["options"]) as task:
        model, result = train_sft(task, steps=steps, target_accuracy=None, eval_every=steps, seed=seed)
    save_warm_start(model, result, TASK, checkpoint)
    print(f"warm start: {result.steps} steps, held-out accuracy {result.eval_accuracy:.3f} -> {checkpoint}")


def one_run(checkpoint: Path, steps: int, seed: int, max_staleness: int, samplers: int) -> dict:
    """One ``nibble run`` of :data:`TASK` in a temporary directory; what the comparison needs from it."""
    data = load(ROOT / "configs" / "default.yaml").model_dump(mode="json")
    data.update(seed=seed, num_samplers=samplers, task=TASK)
    data["model"]["checkpoint"] = str(checkpoint)
    data["trainer"].update(total_steps=steps, max_staleness=max_staleness, eval_every=steps)
    config = RunConfig.model_validate(data)
    with TemporaryDirectory() as tmp:
        out = Path(tmp)
        record = RunRecord(config=config.model_dump(mode="json"))
        record.begin(out, first_step=0)
        effective = launch(config, out)
        record.close(out, "finished")
        summary = summarize(out, effective, record.segments)
        steps_run = [x for x in read_lines(out) if x["step"] > 0]
    keys = ("wall_seconds", "final_reward", "eval_accuracy_after", "mean_staleness", "sampler_tokens_per_second")
    record = {k: summary[k] for k in (*keys, "trainer_idle_seconds", "stale_dropped")}
    record["trainer_utilisation"] = 1 - summary["trainer_idle_seconds"] / summary["wall_seconds"]
    trajectories = sum(x["trained_trajectories"] for x in steps_run)
    record["mean_response_tokens"] = sum(x["trained_tokens"] for x in steps_run) / trajectories
    record.update(seed=seed, max_staleness=max_staleness, num_samplers=samplers)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=ROOT / "runs" / "warm_start_heavy_tail",
        help="warm start on the task (trained there first when missing)",
    )
    parser.add_argument("--steps", type=positive, default=60, help="trainer steps per run")
    parser.add_argument(
        "--seeds", type=non_negative, action=AddUp, default=[0, 1, 2], help="seeds of the 2-sampler runs"
    )
    parser.add_argument(
        "--samplers",
        type=positive,
        action=AddUp,
        default=[1, 2, 4],
        help="sampler counts, 2 among them (the async-over-sync figure; the others: first seed only)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "async_speedup.json")
    args = parser.parse_args()
    if 2 not in args.samplers:
        parser.error(
            f"--samplers {' '.join(map(str, args.samplers))}: 2 must be among them (the async-over-sync figure)"
        )
    if problem := out_problem(args.out):
        parser.error(f"--out {args.out}: {problem}")
    ensure_warm_start(args.checkpoint)
    plan = [(seed, staleness, 2) for seed in args.seeds for staleness in (0, 2) if 2 in args.samplers]
    plan += [(args.seeds[0], staleness, n) for n in args.samplers if n != 2 for staleness in (0, 2)]
    runs = []
    for seed, staleness, samplers in plan:
        runs.append(one_run(args.checkpoint, args.steps, seed, staleness, samplers))
        print(json.dumps(runs[-1]), flush=True)
    result = {
        "benchmark": "async_speedup",
        "task": TASK,
        "steps": args.steps,
        "machine": describe(),
        "speedup_async_over_sync": speedup(runs, samplers=2),
        "speedup_by_samplers": {n: speedup(runs, samplers=n) for n in args.samplers},
        "target": TARGET,
        "runs": runs,
    }
    print(f"async (max_staleness 2) is {result['speedup_async_over_sync']:.2f}x faster than sync (target {TARGET}x)")
    write_record(args.out, result)


def speedup(runs: list[dict], samplers: int) -> float | None:
    """Mean synchronous wall-clock over mean asynchronous wall-clock, at ``samplers`` samplers."""
    sync = [r["wall_seconds"] for r in runs if r["max_staleness"] == 0 and r["num_samplers"] == samplers]
    asyn = [r["wall_seconds"] for r in runs if r["max_staleness"] == 2 and r["num_samplers"] == samplers]
    return fmean(sync) / fmean(asyn) if sync and asyn else None


if __name__ == "__main__":
    main()
