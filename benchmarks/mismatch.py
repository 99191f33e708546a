"""Record the train/rollout mismatch table (``nibble mismatch``) as JSON, with the machine.

.venv/bin/nibble sft --out runs/warm_start     # once
.venv/bin/python -m benchmarks.mismatch --checkpoint runs/warm_start
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.machine import describe
from nibble.analysis.mismatch_report import as_json, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mismatch.json")
    args = parser.parse_args()
    rows = measure(args.checkpoint, prompts=args.prompts, seed=args.seed)
    for r in rows:
        print(f"{r.plan:45s} {r.trainer:24s} |Δlogprob| {r.logprob_abs_diff:.4g}  k3 {r.mismatch_kl:.3g}")
    record = {
        "benchmark": "mismatch",
        "checkpoint": str(args.checkpoint),
        "prompts": args.prompts,
        "machine": describe(),
        "rows": as_json(rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"recorded in {args.out}")


if __name__ == "__main__":
    main()
