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

    from nibble.metrics import Metrics
    from nibble.model import from_pretrained, load_config
    from nibble.recipe import PrecisionPlan, param_groups
    from nibble.tasks import get_task
    from nibble.trainer import checkpoint, sharded
    from nibble.trainer.service import Trainer

    t = config.trainer
    torch.set_num_threads(t.threads)
    torch.manual_seed(config.seed)
    if t.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but no CUDA GPU is visible to this process")
    shard = sharded.init_process_group(t.device, t.collective_timeout_s) if sharded.launched_by_torchrun() else None
    resume = checkpoint.latest(t.checkpoint_dir)
    if resume is not None:
        checkpoint.check_layout(resume, sharded=shard is not None)
    # sharded: every rank loads the warm start, keeps its shard, then the checkpoint's shards replace it
    source = resume if resume is not None and shard is None else config.model.checkpoint
    plan = PrecisionPlan.from_config(config.plan, load_config(source).num_hidden_layers)
    model = from_pretrained(source, plan=plan).train()
    model = model.to(t.device) if shard is None else sharded.shard_model(model)
    optimizer = torch.optim.AdamW(param_groups(model, plan, t.weight_decay), lr=t.learning_rate)
    if resume is not None:
        load = checkpoint.load_optimizer if shard is None else checkpoint.load_sharded
        load(resume, model, optimizer)
    state = checkpoint.load_state(resume) if resume is not None else checkpoint.TrainerState()
    task = get_task(config.task.name, **config.task.options)
    metrics = Metrics("trainer")
    services = (None, None, None, None)
    if shard is None or shard.rank == 0:
        services = _connect(config, metrics, state)
    if shard is not None:
        state.policy_version = sharded.broadcast(state.policy_version)
    reader, admission, samplers, publisher = services
    return Trainer(
        config,
        task,
        model,
        optimizer,
        state,
        reader,
        admission,
        samplers,
        publisher,
        metrics,
        out,
        stop=stop,
        shard=shard,
    )


def _connect(config, metrics, state):
    """Rank 0's links to the outside: metrics endpoint, the stream, admission, live samplers, weight-sync."""
    from nibble.transport import AdmissionCounter, TrajectoryReader, connect, publisher_from_config
    from nibble.transport.presence import SamplerRegistry

    port = metrics.serve(config.trainer.metrics_port, config.trainer.metrics_host).server_port
    logging.getLogger("nibble").info("metrics on http://127.0.0.1:%d/metrics", port)
    client = connect(config.redis)
    reader = TrajectoryReader(
        client,
        config.redis,
        consumer="trainer",
        on_dead_letter=lambda reason: metrics.dead_lettered.labels(reason=reason).inc(),
    )
    admission = AdmissionCounter(client, config.redis)
    publisher = publisher_from_config(config.weightsync)
    state.policy_version = max(state.policy_version, publisher.latest_version())
    admission.set_trainer_version(state.policy_version)
    return reader, admission, SamplerRegistry(client, config.redis), publisher


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
    from nibble.transport.health import start_health

    # Rank 0 alone answers health checks (one port per pod); it is SERVING once everything is built.
    health = start_health(config.trainer.metrics_host, config.trainer.health_port) if trainer.leader else None
    if health is not None:
        health.serving()
    try:
        finished = trainer.run()
    finally:
        if health is not None:
            health.stop()
    if trainer.shard is not None:
        from nibble.trainer import sharded

        sharded.close()
    # Stopped before total_steps is not success: a Kubernetes Job must not count an evicted trainer done.
    return 0 if finished else STOPPED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
