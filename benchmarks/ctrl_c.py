"""How long Ctrl-C takes to stop ``nibble run``: SIGINT after a few trainer steps, until the launcher exits.

Each repeat starts ``nibble run`` on ``configs/smoke.yaml`` (with more steps than it will reach) in a fresh
folder, waits until the trainer has recorded ``--after-step`` steps, sends SIGINT and times the launcher's
exit; it also keeps the stages' own times that the launcher prints ("stopped trainer in 1.2 s"), the exit
code, and whether any log holds a traceback. The machine's load average is recorded beside the figures.

    .venv/bin/python -m benchmarks.ctrl_c --warm-start runs/warm_start [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean

from benchmarks.machine import describe, write_record

ROOT = Path(__file__).resolve().parents[1]
NIBBLE = str(Path(sys.executable).with_name("nibble"))
STAGE = re.compile(r"^stopped (\S+) in (\d+\.\d) s", re.MULTILINE)


def steps_recorded(out: Path) -> int:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.endswith("}") and '"step": 0,' not in line)


def one(warm_start: Path, after_step: int, folder: Path) -> dict:
    """One interrupted run: seconds from SIGINT to the launcher's exit, each stage's time, exit code."""
    out = folder / "run"
    env = {**os.environ, "NIBBLE_MODEL__CHECKPOINT": str(warm_start), "NIBBLE_TRAINER__TOTAL_STEPS": "1000"}
    argv = [NIBBLE, "run", "--config", str(ROOT / "configs" / "smoke.yaml"), "--out", str(out)]
    launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 600
    while steps_recorded(out) < after_step:
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            raise SystemExit(f"nibble run ended or stalled before step {after_step}: {launcher.communicate()[0]}")
        time.sleep(0.1)
    load = os.getloadavg()[0]
    sent = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    output, _ = launcher.communicate(timeout=600)
    seconds = time.monotonic() - sent
    tracebacks = [p.name for p in (out / "logs").glob("*.log") if "Traceback" in p.read_text()]
    return {
        "seconds_to_exit": seconds,
        "stages": {name: float(took) for name, took in STAGE.findall(output)},
        "exit_code": launcher.returncode,
        "logs_with_traceback": tracebacks + (["launcher output"] if "Traceback" in output else []),
        "load_average_1min": load,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-start", type=Path, required=True, help="a `nibble sft` checkpoint")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--after-step", type=int, default=2, help="interrupt once this many steps are recorded")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ctrl_c.json")
    args = parser.parse_args(argv)
    if not (args.warm_start / "config.json").is_file():
        parser.error(f"--warm-start {args.warm_start}: no checkpoint there (make one with `nibble sft --out DIR`)")
    runs = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            runs.append(one(args.warm_start.resolve(), args.after_step, Path(folder)))
        print(f"run {i + 1}: {json.dumps(runs[-1])}")
    record = {
        "machine": describe(),
        "config": "configs/smoke.yaml",
        "after_step": args.after_step,
        "mean_seconds_to_exit": fmean(r["seconds_to_exit"] for r in runs),
        "max_seconds_to_exit": max(r["seconds_to_exit"] for r in runs),
        "runs": runs,
    }
    write_record(args.out, record)
    print(f"Ctrl-C to exit: mean {record['mean_seconds_to_exit']:.1f} s, max {record['max_seconds_to_exit']:.1f} s")


if __name__ == "__main__":
    main()
