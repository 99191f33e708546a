"""``python -m nibble.sampler --config FILE --name NAME``: parse and validate config before heavy imports."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="nibble sampler", description="Nibble's sampler service")
    parser.add_argument("--config", type=Path, required=True, help="run configuration (YAML)")
    parser.add_argument("--name", default="sampler", help="sampler name (ids get a unique suffix)")
    parser.add_argument("--out", type=Path, default=None, help="write counters to OUT/samplers/NAME.json")
    args = parser.parse_args(argv)
    from nibble.config import load

    try:
        return args, load(args.config)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")


def build(config, name: str, out: Path | None):
    import torch

    from nibble import devices
    from nibble.metrics import Metrics
    from nibble.model import from_pretrained, load_config
    from nibble.recipe import PrecisionPlan
    from nibble.sampler.engine import BuiltinEngine
    from nibble.sampler.service import Sampler
    from nibble.tasks import get_task
    from nibble.transport import AdmissionCounter, TrajectoryWriter, connect, subscriber_from_config
    from nibble.transport.presence import SamplerRegistry

    s = config.sampler
    torch.set_num_threads(s.threads)
    device = devices.resolve("sampler.device", s.device, s.gpu_memory_fraction)
    checkpoint = config.model.checkpoint
    plan = PrecisionPlan.from_config(config.plan, load_config(checkpoint).num_hidden_layers, config.plan_device)
    model = from_pretrained(checkpoint, plan=plan).to(device).pack()
    task = get_task(config.task.name, **config.task.options)
    engine = BuiltinEngine(model, pad_id=task.tokenizer.pad_id, batch_rows=s.groups_per_batch * s.group_size)
    metrics = Metrics("sampler")
    keys = ("sampler.metrics_host", "sampler.metrics_port")
    port = metrics.serve(config.sampler.metrics_port, config.sampler.metrics_host, keys=keys).server_port
    logging.getLogger("nibble").info("metrics on http://127.0.0.1:%d/metrics", port)
    client = connect(config.redis)
    subscriber = subscriber_from_config(config.weightsync, name)
    return Sampler(
        config,
        task,
        engine,
        TrajectoryWriter(client, config.redis),
        AdmissionCounter(client, config.redis),
        subscriber,
        metrics,
        name=name,
        stats_file=stats_file(out, name),
        registry=SamplerRegistry(client, config.redis),
    )


def stats_file(out: Path | None, name: str) -> Path | None:
    if out is None:
        return None
    (out / "samplers").mkdir(parents=True, exist_ok=True)
    return out / "samplers" / f"{name}.json"


def main(argv: list[str] | None = None) -> int:
    args, config = parse(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    from nibble.transport.health import start_health

    health = start_health(config.sampler.metrics_host, config.sampler.health_port)
    try:
        sampler = build(config, args.name, args.out)
    except ValueError as exc:  # a device, a checkpoint, a metrics address, … named in the message
        print(f"error: {exc}", file=sys.stderr)
        if health is not None:
            health.stop()
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sampler.stop.set())
    signal.signal(signal.SIGINT, lambda *_: sampler.stop.set())
    if health is not None:
        health.serving()
    from nibble.sampler.service import EXIT_ENGINE_FAILED, EngineFailed

    try:
        sampler.run()
    except EngineFailed as exc:
        print(f"error: sampler {args.name}: {exc}", file=sys.stderr)
        return EXIT_ENGINE_FAILED
    finally:
        if health is not None:
            health.stop()
    logging.getLogger("nibble.sampler").info("stopped: %d groups written", sampler.stats.groups_written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
