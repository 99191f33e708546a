"""``python -m nibble.trainer --config FILE --out DIR``: parse and validate config before heavy imports."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

STOPPED_EXIT_CODE = 128 + int(signal.SIGTERM)
"""Exit status of a trainer stopped (SIGTERM/SIGINT) after its last checkpoint, before ``total_steps``."""


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="nibble trainer", description="Nibble's trainer service")
    parser.add_argument("--config", type=Path, required=True, help="run configuration (YAML)")
    parser.add_argument("--out", type=Path, default=Path("runs/trainer-out"), help="metrics.jsonl goes here")
    args = parser.parse_args(argv)
    from nibble.config import load

    try:
        return args, load(args.config)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")


def build(config, out: Path, stop: threading.Event):
    """Model (latest checkpoint, else the warm start), optimiser, stream reader, publisher.

    Under ``torchrun`` (``trainer.nproc_per_node`` > 1) every rank builds its shard of the model and
    optimiser; only rank 0 connects to Redis and weight-sync and serves metrics.

    Raises:
        ValueError: ``trainer.device=cuda`` without a GPU, or a checkpoint written with another layout
            (sharded vs single-process).
    """
    import torch

    from nibble.monitoring.metrics import Metrics
    from nibble.tasks import get_task
    from nibble.trainer.backend import check_backend
    from nibble.trainer.service import Links, Trainer

    t = config.trainer
    check_backend(t.backend, t.device)
    torch.set_num_threads(t.threads)
    torch.manual_seed(config.seed)
    parallel, device = _parallelism(t)
    policy = build_policy(t, config.model.checkpoint, config.plan, config.plan_device, parallel, device)
    task = get_task(config.task.name, **config.task.options)
    metrics = Metrics("trainer")
    links, published = Links(), 0
    if parallel.leader:
        links, published = _connect(config, metrics)
    published = parallel.broadcast(published)
    trainer = Trainer(settings(config), task, policy, links, metrics, out, parallel=parallel, stop=stop)
    trainer.continue_above(published)
    return trainer


def settings(config):
    """The trainer's :class:`~nibble.trainer.service.TrainerSettings`: its section, the temperature samplers
    sample at, the run's sampler count, and the run's provenance on this machine."""
    from nibble.rundir.provenance import provenance
    from nibble.trainer.service import TrainerSettings

    return TrainerSettings(config.trainer, config.sampler.temperature, config.num_samplers, provenance(config))


def _parallelism(t):
    """This process's :class:`~nibble.trainer.parallel.Parallelism` and, single-process, its device.

    Raises:
        ValueError: ``trainer.device`` names a device this process cannot use.
    """
    import torch

    from nibble.config import devices
    from nibble.trainer import sharded
    from nibble.trainer.parallel import SINGLE_PROCESS

    if not sharded.launched_by_torchrun():
        return SINGLE_PROCESS, devices.resolve("trainer.device", t.device, t.gpu_memory_fraction)
    if t.device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={t.device} but no CUDA GPU is visible to this process")
    return sharded.init_process_group(t.device, t.collective_timeout_s), None


def build_policy(t, warm_start: Path, plan_config, plan_device, parallel, device):
    """Model, optimiser and counters of the ``trainer`` section ``t``: the latest checkpoint's, else the
    warm start's (``plan_config`` on ``plan_device``: the run's precision plan), placed by ``parallel``.

    Raises:
        ValueError: a checkpoint written with another layout (sharded vs single-process), or damaged.
    """
    import torch

    from nibble.model import from_pretrained, load_config
    from nibble.recipe import PrecisionPlan, param_groups
    from nibble.trainer import checkpoint
    from nibble.trainer.service import Policy

    resume = checkpoint.latest(t.checkpoint_dir)
    if resume is not None:
        checkpoint.check_layout(resume, sharded=parallel.sharded)
    source = parallel.model_source(resume, warm_start)
    plan = PrecisionPlan.from_config(plan_config, load_config(source).num_hidden_layers, plan_device)
    model = parallel.prepare_model(from_pretrained(source, plan=plan).train(), device)
    optimizer = torch.optim.AdamW(param_groups(model, plan, t.weight_decay), lr=t.learning_rate)
    if resume is not None:
        checkpoint.load_weights(resume, model, optimizer, parallel)
    state = checkpoint.load_state(resume) if resume is not None else checkpoint.TrainerState()
    return Policy(model, optimizer, state)


def _connect(config, metrics):
    """Rank 0's links to the outside (metrics endpoint, the stream, admission, live samplers, weight-sync)
    and the highest policy version ever published (:func:`highest_published`)."""
    from nibble.trainer.service import Links
    from nibble.transport.stream import AdmissionCounter, RedisTrajectoryReader, connect
    from nibble.transport.stream.presence import SamplerRegistry
    from nibble.transport.weights import publisher_from_config

    keys = ("trainer.metrics_host", "trainer.metrics_port")
    port = metrics.serve(config.trainer.metrics_port, config.trainer.metrics_host, keys=keys).server_port
    logging.getLogger("nibble").info("metrics on http://127.0.0.1:%d/metrics", port)
    client = connect(config.redis)
    admission = AdmissionCounter(client, config.redis)

    def on_dead_letter(reason: str) -> None:
        metrics.dead_lettered.labels(reason=reason).inc()
        admission.release(1)  # a dead-lettered group will never be trained: its slot comes back

    reader = RedisTrajectoryReader(client, config.redis, consumer="trainer", on_dead_letter=on_dead_letter)
    publisher = publisher_from_config(config.weightsync)
    links = Links(reader, admission, publisher, SamplerRegistry(client, config.redis))
    return links, highest_published(publisher, admission)


def highest_published(publisher, admission) -> int:
    """The highest policy version ever published: weight-sync's newest, or the trainer version Redis keeps
    (it only grows, and outlives a weight-sync that lost its store); 0 when none."""
    return max(publisher.latest_version(), admission.trainer_version())


def main(argv: list[str] | None = None) -> int:
    args, config = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s trainer %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        trainer = build(config, args.out, stop)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from nibble.transport.weights.health import start_health

    # Rank 0 alone answers health checks (one port per pod); it is SERVING once everything is built.
    health = start_health(config.trainer.metrics_host, config.trainer.health_port) if trainer.leader else None
    if health is not None:
        health.serving()
    try:
        finished = trainer.run()
    finally:
        if health is not None:
            health.stop()
    trainer.parallel.close()
    # Stopped before total_steps is not success: a Kubernetes Job must not count an evicted trainer done.
    return 0 if finished else STOPPED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
