"""``python -m nibble.sampler --config FILE --name NAME``: parse and validate config before heavy imports."""

from __future__ import annotations

import argparse
import logging
import re
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
    """The sampler service: its engine, its /generate endpoint (``sampler.http_port``), metrics, Redis, weights.

    Raises:
        ValueError: a device, checkpoint, metrics address or SGLang server that cannot be used, named.
    """
    from nibble.monitoring.metrics import Metrics
    from nibble.sampler.service import Sampler
    from nibble.tasks import get_task
    from nibble.transport.stream import AdmissionCounter, RedisTrajectoryWriter, connect
    from nibble.transport.stream.presence import SamplerRegistry
    from nibble.transport.weights import subscriber_from_config

    s = config.sampler
    task = get_task(config.task.name, **config.task.options)
    engine = sglang_engine(config, name) if s.engine == "sglang" else builtin_engine(config, task)
    if s.http_port is not None:
        from nibble.sampler.sglang import GenerateEndpoint

        endpoint = GenerateEndpoint(
            engine, s.metrics_host, s.http_port, model_path=str(config.model.checkpoint), decode=task.tokenizer.decode
        )
        logging.getLogger("nibble").info("SGLang /generate on http://%s:%d", s.metrics_host, endpoint.start().port)
    metrics = Metrics("sampler")
    keys = ("sampler.metrics_host", "sampler.metrics_port")
    port = metrics.serve(config.sampler.metrics_port, config.sampler.metrics_host, keys=keys).server_port
    logging.getLogger("nibble").info("metrics on http://127.0.0.1:%d/metrics", port)
    client = connect(config.redis)
    subscriber = subscriber_from_config(config.weightsync, name)
    return Sampler(
        settings(config),
        task,
        engine,
        RedisTrajectoryWriter(client, config.redis),
        AdmissionCounter(client, config.redis),
        subscriber,
        metrics,
        name=name,
        stats_file=stats_file(out, name),
        registry=SamplerRegistry(client, config.redis),
    )


def settings(config):
    """The sampler's :class:`~nibble.sampler.service.SamplerSettings`: its section, the stream's, and the
    trainer's admission numbers (how far ahead of the trainer samplers may run)."""
    from nibble.sampler.service import SamplerSettings

    t = config.trainer
    return SamplerSettings(config.sampler, config.redis, t.max_staleness, t.groups_per_step * t.publish_every)


def builtin_engine(config, task):
    """Nibble's own engine on ``sampler.device``, with the warm start packed under the run's plan."""
    import torch

    from nibble.config import devices
    from nibble.model import from_pretrained, load_config
    from nibble.recipe import PrecisionPlan
    from nibble.sampler.engine import BuiltinEngine

    s = config.sampler
    torch.set_num_threads(s.threads)
    device = devices.resolve("sampler.device", s.device, s.gpu_memory_fraction)
    checkpoint = config.model.checkpoint
    plan = PrecisionPlan.from_config(config.plan, load_config(checkpoint).num_hidden_layers, config.plan_device)
    model = from_pretrained(checkpoint, plan=plan).to(device).pack()
    return BuiltinEngine(model, pad_id=task.tokenizer.pad_id, batch_rows=s.groups_per_batch * s.group_size)


def sglang_engine(config, name: str):
    """The SGLang server of sampler ``name``, checked (:meth:`SGLangEngine.connect`).

    Raises:
        ValueError: no server for ``name``, a server that never became healthy, or one that disagrees.
    """
    from nibble.sampler.sglang import SGLangEngine, SGLangError, SGLangUnavailable

    s, w = config.sampler, config.weightsync
    url = sglang_url(s.sglang_urls, name)
    engine = SGLangEngine(
        url,
        export_dir=w.export_root,
        export_format=w.export_format,
        timeout_seconds=s.sglang_timeout_seconds,
        connect_timeout_seconds=s.sglang_connect_timeout_seconds,
        retry_seconds=s.sglang_retry_seconds,
    )
    try:
        return engine.connect(s.sglang_startup_seconds)
    except SGLangUnavailable as exc:
        raise ValueError(
            f"sampler.sglang_urls: {url} did not pass /health_generate within sampler.sglang_startup_seconds="
            f"{s.sglang_startup_seconds} ({exc})"
        ) from None
    except SGLangError as exc:  # an HTTP error or an unreadable answer while checking it
        raise ValueError(f"sampler.sglang_urls: {url} cannot be used: {exc}") from None


def sglang_url(urls: list[str], name: str) -> str:
    """``sampler-<i>`` drives ``urls[i]``; a sampler of another name needs exactly one URL.

    Raises:
        ValueError: naming ``sampler.sglang_urls`` and ``name``.
    """
    match = re.fullmatch(r".*-(\d+)", name)
    if match and int(match[1]) < len(urls):
        return urls[int(match[1])]
    if not match and len(urls) == 1:
        return urls[0]
    raise ValueError(f"sampler.sglang_urls ({len(urls)} servers) has no server for sampler {name!r}")


def stats_file(out: Path | None, name: str) -> Path | None:
    if out is None:
        return None
    (out / "samplers").mkdir(parents=True, exist_ok=True)
    return out / "samplers" / f"{name}.json"


def main(argv: list[str] | None = None) -> int:
    args, config = parse(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    from nibble.transport.weights.health import start_health

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
