"""Record the train/rollout mismatch table (``nibble mismatch``) as JSON, with the machine.

.venv/bin/nibble sft --out runs/warm_start     # once
.venv/bin/python -m benchmarks.mismatch --checkpoint runs/warm_start
.venv/bin/python -m benchmarks.mismatch --config configs/smollm2-stability.yaml --device cuda \
    --out benchmarks/results/h200_mismatch_smollm2.json     # a run config's model and task, on a GPU
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from benchmarks.arguments import integer_at_least
from benchmarks.machine import describe, write_record
from nibble.analysis.mismatch_report import as_json, measure, source_of


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--checkpoint", type=Path, help="a warm start written by `nibble sft`")
    start.add_argument("--config", type=Path, help="a run config, for its model, task and plan.quantize")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the config's trainer.device)")
    parser.add_argument("--prompts", type=integer_at_least(1), default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mismatch.json")
    args = parser.parse_args(argv)
    try:
        source = source_of(args.checkpoint, args.config, args.device)
        rows = measure(source, prompts=args.prompts, seed=args.seed)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    for r in rows:
        print(f"{r.plan:45s} {r.trainer:24s} |Δlogprob| {r.logprob_abs_diff:.4g}  k3 {r.mismatch_kl:.3g}")
    record = {
        "benchmark": "mismatch",
        "command": shlex.join(
            [".venv/bin/python", "-m", "benchmarks.mismatch", *(sys.argv[1:] if argv is None else argv)]
        ),
        "checkpoint": str(source.checkpoint),
        "config": None if args.config is None else str(args.config),
        "device": source.device,
        "quantize": source.quantize,
        "prompts": args.prompts,
        "machine": describe(),
        "rows": as_json(rows),
    }
    write_record(args.out, record)


if __name__ == "__main__":
    main()
