"""Soak: the whole system for a long time — does any service's memory, or Redis's, keep growing?

Runs ``nibble run``'s services (``nibble.launcher.launch``: a private Redis with AOF, weight-sync, the
trainer, ``--samplers`` samplers) with a step budget no run reaches, for ``--minutes``; every
``--every`` seconds it records the resident set size (``VmRSS``) of every service process and Redis's
``used_memory``. After ``--warmup`` minutes (caches filled, the stream at its working depth) it compares
each series' last sample with its value at the end of the warm-up: the target is growth below 10% for
every one of them. Not part of CI (30 minutes by default). Records JSON with the machine in
benchmarks/results/soak.json.

    .venv/bin/python -m benchmarks.soak [--config configs/default.yaml] [--samplers 4] [--minutes 30]
        [--warmup 5] [--every 15]

The warm start must exist (``nibble run`` or ``nibble sft`` makes it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import redis
import yaml

from benchmarks.machine import describe, write_record
from nibble.config import load
from nibble.launcher import launch

TARGET_GROWTH = 0.10


class SoakOver(Exception):
    """Raised from the progress callback when the soak's time is up (the launcher then stops everything)."""


def service_processes(out: Path) -> dict[str, int]:
    """PIDs of this run's processes by service name: those whose command line names ``out``'s config (the
    services) or its Redis directory."""
    config, redis_dir = str(out / "config.yaml"), str(out / "redis")
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # exited meanwhile
        if redis_dir in argv and any(a.endswith("redis-server") for a in argv):
            found["redis"] = int(proc.name)
        elif config in argv and "-m" in argv:
            module = argv[argv.index("-m") + 1]
            name = argv[argv.index("--name") + 1] if "--name" in argv else module.removeprefix("nibble.")
            if module == "torch.distributed.run":
                continue  # torchrun's own agent: its worker processes are counted
            found[name] = int(proc.name)
    return found


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def growth(samples: list[dict], key: str, warmup_seconds: float) -> float | None:
    """Relative growth of series ``key`` from the first sample after the warm-up to the last sample."""
    values = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
    after = [v for t, v in values if t >= warmup_seconds]
    if len(after) < 2 or after[0] == 0:
        return None
    return after[-1] / after[0] - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--samplers", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="minutes before growth is measured")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "soak.json")
    args = parser.parse_args()
    if not 0 < args.warmup < args.minutes or args.every <= 0 or args.samplers < 1:
        parser.error("need samplers >= 1, every > 0 and 0 < warmup < minutes")
    config = load(args.config)
    if not Path(config.model.checkpoint).is_dir():
        parser.error(f"warm start {config.model.checkpoint} missing: run `nibble sft` or `nibble run` first")
    data = config.model_dump(mode="json")
    data["num_samplers"] = args.samplers
    data["trainer"]["total_steps"] = 10**9  # the soak ends on time, not on steps
    config = type(config).model_validate(data)

    samples: list[dict] = []
    started = time.monotonic()
    last = {"t": -args.every}

    def sample(out: Path) -> None:
        t = time.monotonic() - started
        if t - last["t"] >= args.every:
            last["t"] = t
            record = {"t": round(t, 1)}
            for name, pid in service_processes(out).items():
                record[f"rss:{name}"] = rss_bytes(pid)
            url = yaml.safe_load((out / "config.yaml").read_text())["redis"]["url"]
            with redis.Redis.from_url(url, socket_timeout=5) as client:
                record["redis_used_memory"] = int(client.info("memory")["used_memory"])
            steps = (out / "metrics.jsonl").read_text().count("\n") if (out / "metrics.jsonl").exists() else 0
            record["trainer_lines"] = steps
            samples.append(record)
            print(json.dumps(record), flush=True)
        if t >= args.minutes * 60:
            raise SoakOver

    with tempfile.TemporaryDirectory(prefix="nibble-soak-") as tmp:
        try:
            launch(config, Path(tmp) / "run", on_progress=sample, poll_seconds=1.0)
            raise RuntimeError("the trainer finished before the soak's time was up")
        except SoakOver:
            pass
    warmup = args.warmup * 60
    series = sorted({k for s in samples for k in s if k.startswith("rss:") or k == "redis_used_memory"})
    growths = {k: growth(samples, k, warmup) for k in series}
    record = {
        "machine": describe(),
        "config": str(args.config),
        "samplers": args.samplers,
        "minutes": args.minutes,
        "warmup_minutes": args.warmup,
        "target_growth": TARGET_GROWTH,
        "growth": growths,
        "passed": all(g is not None and g < TARGET_GROWTH for g in growths.values()),
        "samples": samples,
    }
    write_record(args.out, record)
    for key, value in growths.items():
        print(f"{key:32s} {'-' if value is None else f'{100 * value:+.1f}%'}")
    verdict = "passed" if record["passed"] else "FAILED"
    print(f"{verdict} (target < {100 * TARGET_GROWTH:.0f}% growth after the warm-up)")


if __name__ == "__main__":
    main()
