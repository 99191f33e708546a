"""Reliability fixtures: an in-process trainer on the session's real Redis, groups as samplers write them."""

from __future__ import annotations

import threading

import pytest
import torch

from nibble.config import RunConfig
from nibble.model import MoETransformer, tiny
from nibble.monitoring.metrics import Metrics
from nibble.recipe import PrecisionPlan, param_groups
from nibble.tasks import get_task
from nibble.trainer import checkpoint
from nibble.trainer.main import settings as trainer_settings
from nibble.trainer.service import Links, Policy, Trainer
from nibble.transport.stream import AdmissionCounter, RedisTrajectoryReader, RedisTrajectoryWriter, connect
from nibble.wire import pb


def make_group(name: str, tokens: list[list[int]], version: int = 0, temperature: float = 1.0) -> pb.TrajectoryGroup:
    """A group that passes ``validate_group``: one response per token list, rewards 1, 0, 1, …"""
    group = pb.TrajectoryGroup(
        group_id=f"{name}-g", example_id="e", prompt_tokens=[1, 2, 3], policy_version=version,
        sampler_id=name, temperature=temperature,
    )  # fmt: skip
    for i, response in enumerate(tokens):
        group.responses.add(
            trajectory_id=f"{name}-{i}", tokens=response, logprobs=[-1.0] * len(response),
            reward=float(i % 2 == 0), finish_reason=pb.STOP,
        )  # fmt: skip
    return group


def run_config(stream_config, tmp_path, **trainer) -> RunConfig:
    settings = {"groups_per_step": 1, "total_steps": 100, "eval_every": 1000, "checkpoint_dir": tmp_path / "ckpt"}
    return RunConfig(
        redis=stream_config,
        trainer={**settings, **trainer},
        sampler={"group_size": 2, "groups_per_batch": 1},
        task={"name": "addition", "options": {"digits": 1, "eval_size": 4, "holdout_fraction": 0.5}},
    )


class InProcessTrainer:
    """What ``nibble.trainer.main.build`` assembles on a tiny model of ``vocab`` tokens, publishing to
    ``publisher`` (None: versions only counted)."""

    def __init__(self, config: RunConfig, out, vocab: int = 15, publisher=None):
        torch.manual_seed(0)
        self.client = connect(config.redis)
        self.metrics = Metrics("trainer")
        self.admission = AdmissionCounter(self.client, config.redis)
        model_config = tiny(vocab_size=vocab).model_copy(update={"max_position_embeddings": 16})
        plan = PrecisionPlan(num_layers=model_config.num_hidden_layers, format="bf16")
        model = MoETransformer(model_config, plan)
        optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=1e-4)
        resume = checkpoint.latest(config.trainer.checkpoint_dir)
        state = checkpoint.load_state(resume) if resume else checkpoint.TrainerState()

        def on_dead_letter(reason: str) -> None:
            self.metrics.dead_lettered.labels(reason=reason).inc()
            self.admission.release(1)

        reader = RedisTrajectoryReader(self.client, config.redis, "trainer", on_dead_letter=on_dead_letter)
        task = get_task(config.task.name, **config.task.options)
        out.mkdir(parents=True, exist_ok=True)
        links = Links(reader, self.admission, publisher)
        policy = Policy(model, optimizer, state)
        settings = trainer_settings(config)
        self.trainer = Trainer(settings, task, policy, links, self.metrics, out, stop=threading.Event())


@pytest.fixture
def writer(stream_config):
    return RedisTrajectoryWriter(connect(stream_config), stream_config)


def sampler_config(stream_config, **redis) -> RunConfig:
    """``configs/sync.yaml``'s admission numbers (max_staleness 0, groups_per_step 8, groups_per_batch 4) on
    the 1-digit addition task, with this test's stream and a short admission lease."""
    return RunConfig(
        redis=stream_config.model_copy(update={"admission_lease_seconds": 1.0, **redis}),
        trainer={"groups_per_step": 8, "max_staleness": 0},
        sampler={"group_size": 2, "groups_per_batch": 4, "max_engine_failures": 2},
        task={"name": "addition", "options": {"digits": 1, "eval_size": 4, "holdout_fraction": 0.5}},
    )


def tiny_engine(vocab: int, plan: PrecisionPlan | None = None):
    """The built-in engine on a tiny random model (``plan``: bf16 throughout by default)."""
    from nibble.sampler.engine import BuiltinEngine

    torch.manual_seed(0)
    model_config = tiny(vocab_size=vocab)
    plan = plan or PrecisionPlan(num_layers=model_config.num_hidden_layers, format="bf16")
    return BuiltinEngine(MoETransformer(model_config, plan).pack(), pad_id=0)


def make_sampler(config: RunConfig, engine=None, name: str = "sampler", subscriber=None):
    """A real :class:`~nibble.sampler.service.Sampler` (no weight-sync) on the built-in engine with a tiny
    random bf16 model, or on ``engine``."""
    from nibble.sampler.main import settings as sampler_settings
    from nibble.sampler.service import Sampler

    task = get_task(config.task.name, **config.task.options)
    engine = engine or tiny_engine(task.tokenizer.vocab_size)
    client = connect(config.redis)
    settings = sampler_settings(config)
    return Sampler(
        settings, task, engine, RedisTrajectoryWriter(client, config.redis), AdmissionCounter(client, config.redis),
        subscriber, Metrics("sampler"), name=name,
    )  # fmt: skip
