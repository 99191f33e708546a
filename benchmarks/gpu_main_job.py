"""The main job on one GPU: a GPU config (trainer and two samplers sharing GPU 0) run as a user runs it.

``configs/gpu.yaml`` (the tiny MoE on addition) or ``configs/smollm2-gpu.yaml`` (SmolLM2-135M-Instruct on
reasoning-gym chain sums). Up to three runs of ``nibble run`` at equal steps, one after another: NVFP4
rollouts asynchronous (``max_staleness: 2``), NVFP4 synchronous (``max_staleness: 0``), and BF16 rollouts
asynchronous. Each records held-out accuracy before → after, rewards, wall-clock, sampler and trainer
tokens/s, trainer idle time, mean staleness, |Δlogprob| at staleness 0 (the bit-exact contract: must be
0) and overall, and the GPU memory each service held (``nvidia-smi``, sampled every 2 s); the whole in a
JSON file with the machine it ran on. ``--variants`` runs some of them; a later invocation with the same
config and steps adds its runs to the same file (runs may be split over several sessions of a GPU machine).

Reproduce on a CUDA machine (the tiny MoE's warm start is trained first when missing, about a minute):

    python -m benchmarks.gpu_main_job --steps 150
    python -m benchmarks.gpu_main_job --config configs/smollm2-gpu.yaml --steps 60 \
        --out benchmarks/results/h200_smollm2_main_job.json     # after nibble import-model (see the config)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

from benchmarks.machine import describe, out_problem, write_record
from benchmarks.options import AddUp

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "nvfp4_async": {},
    "nvfp4_sync": {"NIBBLE_TRAINER__MAX_STALENESS": "0"},
    "bf16_async": {"NIBBLE_PLAN__FORMAT": "bf16"},
}
FIELDS = (
    "eval_accuracy_before",
    "eval_accuracy_after",
    "initial_reward",
    "final_reward",
    "wall_seconds",
    "sampler_tokens_per_second",
    "trainer_tokens_per_second",
    "trainer_idle_seconds",
    "mean_staleness",
    "fresh_logprob_abs_diff_mean",
    "logprob_abs_diff_mean",
    "mismatch_kl_mean",
)


def gpu_memory(stop: threading.Event, peaks: dict[str, int]) -> None:
    """Peak MiB per service, by its command line, until ``stop`` is set."""
    while not stop.wait(2.0):
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        rows = subprocess.run(query, capture_output=True, text=True).stdout.splitlines()
        for row in rows:
            pid, _, used = row.partition(",")
            try:
                args = Path(f"/proc/{pid.strip()}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            role = next((a.decode() for a in args if a.startswith(b"nibble.")), "other")
            if b"--name" in args:
                role = args[args.index(b"--name") + 1].decode()
            peaks[role] = max(peaks.get(role, 0), int(used))


def run(name: str, config: Path, env: dict[str, str], steps: int, out: Path) -> dict:
    peaks: dict[str, int] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=gpu_memory, args=(stop, peaks), daemon=True)
    watcher.start()
    command = [sys.executable, "-c", "from nibble.cli.app import main; main()", "run", "--config", str(config)]
    environ = {**os.environ, **env, "NIBBLE_TRAINER__TOTAL_STEPS": str(steps)}
    result = subprocess.run([*command, "--out", str(out / name)], cwd=ROOT, env=environ, capture_output=True, text=True)
    stop.set()
    watcher.join()
    if result.returncode != 0:
        raise SystemExit(
            f"{name}: nibble run exited {result.returncode}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    summary = json.loads((out / name / "summary.json").read_text())
    record = {key: summary[key] for key in FIELDS} | {"gpu_memory_mib": peaks, "overrides": env}
    print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/gpu.yaml"))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--variants", action=AddUp, choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "gpu_main_job", help="run directories")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "h200_gpu_main_job.json")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps {args.steps} must be at least 1")
    if not (ROOT / args.config).is_file():
        parser.error(f"--config {args.config}: no such file under {ROOT}")
    if problem := out_problem(args.out):
        parser.error(f"--out {args.out}: {problem}")
    if not torch.cuda.is_available():
        parser.exit(2, "benchmarks.gpu_main_job needs a CUDA GPU (the GPU configs place every service on GPU 0)\n")
    record = {"machine": describe(), "config": str(args.config), "steps": args.steps, "runs": {}}
    if args.out.is_file():
        earlier = json.loads(args.out.read_text())
        if (earlier.get("config"), earlier.get("steps")) == (str(args.config), args.steps):
            record["runs"] = earlier["runs"]  # the same experiment run in parts: keep the parts done before
    for name in args.variants:
        record["runs"][name] = run(name, args.config, VARIANTS[name], args.steps, args.runs) | {"machine": describe()}
        write_record(args.out, record, announce=False)  # each finished run is kept
    runs = record["runs"]
    if {"nvfp4_sync", "nvfp4_async"} <= set(runs):
        record["sync_over_async_wall_clock"] = runs["nvfp4_sync"]["wall_seconds"] / runs["nvfp4_async"]["wall_seconds"]
    if {"bf16_async", "nvfp4_async"} <= set(runs):
        record["nvfp4_over_bf16_sampler_tokens_per_second"] = (
            runs["nvfp4_async"]["sampler_tokens_per_second"] / runs["bf16_async"]["sampler_tokens_per_second"]
        )
    write_record(args.out, record)


if __name__ == "__main__":
    main()
