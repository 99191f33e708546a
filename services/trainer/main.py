"""``python -m nibble.trainer --config FILE --out DIR``: parse and validate config before heavy imports."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path


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
    """Model (latest checkpoint, else the warm start), optimiser, stream reader, publisher."""
    import torch

    from nibble.metrics import Metrics
    from nibble.model import from_pretrained, load_config
    from nibble.recipe import PrecisionPlan, param_groups
    from nibble.tasks import get_task
    from nibble.trainer import checkpoint
    from nibble.trainer.service import Trainer
    from nibble.transport import AdmissionCounter, TrajectoryReader, connect, publisher_from_config

    t = config.trainer
    torch.set_num_threads(t.threads)
    torch.manual_seed(config.seed)
    resume = checkpoint.latest(t.checkpoint_dir)
    source = resume or config.model.checkpoint
    plan = PrecisionPlan.from_config(config.plan, load_config(source).num_hidden_layers)
    model = from_pretrained(source, plan=plan).train()
    optimizer = torch.optim.AdamW(param_groups(model, plan, t.weight_decay), lr=t.learning_rate)
    state = checkpoint.TrainerState()
    if resume is not None:
        checkpoint.load_optimizer(resume, model, optimizer)
        state = checkpoint.load_state(resume)
    metrics = Metrics("trainer")
    port = metrics.serve(t.metrics_port).server_port
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
    task = get_task(config.task.name, **config.task.options)
    trainer = Trainer(config, task, model, optimizer, state, reader, admission, publisher, metrics, out, stop=stop)
    return trainer


def main(argv: list[str] | None = None) -> int:
    args, config = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s trainer %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    args.out.mkdir(parents=True, exist_ok=True)
    trainer = build(config, args.out, stop)
    trainer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
