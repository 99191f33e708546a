"""The trainer loop on its own: the real tiny model and recipe fed by an in-memory stream, checking what it
trains, publishes, checkpoints and acknowledges, and the metrics it records."""

import json
from collections import Counter, deque
from types import SimpleNamespace

import pytest
import torch

from nibble.config import TrainerConfig
from nibble.model import MoETransformer, tiny
from nibble.monitoring.metrics import Metrics
from nibble.recipe import PrecisionPlan, param_groups
from nibble.tasks import get_task
from nibble.trainer import checkpoint
from nibble.trainer.service import Links, Policy, Trainer, TrainerSettings
from nibble.transport.stream import StreamEntry
from tests.trainer.test_step import sampled_groups


class MemoryStream:
    """The trainer's side of the stream, in memory: hands out ``entries`` in order, records the rest."""

    def __init__(self, entries: list[StreamEntry]):
        self.pending = deque(entries)
        self.acked: list[str] = []
        self.trims = 0
        self.dead: list[tuple[str, str]] = []
        self.dead_lettered: Counter[str] = Counter()

    def read(self, count: int, block_seconds: float = 0.0) -> list[StreamEntry]:
        return [self.pending.popleft() for _ in range(min(count, len(self.pending)))]

    def ack(self, entry_ids) -> int:
        self.acked += list(entry_ids)
        return len(entry_ids)

    def trim(self) -> int:
        self.trims += 1
        return 0

    def depth(self) -> int:
        return len(self.pending)

    def dead_letter(self, entry_id: str, reason: str, payload: bytes) -> None:
        self.dead.append((entry_id, reason))


class Recorder:
    """Publisher and admission counter in one: the versions published and the slots given back."""

    def __init__(self):
        self.published: list[tuple[int, dict]] = []
        self.trainer_versions: list[int] = []
        self.released = 0

    def publish(self, version, state, plan):
        self.published.append((version, state))
        return SimpleNamespace(bytes_received=sum(t.numel() * t.element_size() for t in state.values()))

    def set_trainer_version(self, version: int) -> None:
        self.trainer_versions.append(version)

    def release(self, count: int) -> None:
        self.released += count


@pytest.fixture(scope="module")
def task():
    with get_task("addition", digits=1, eval_size=4, holdout_fraction=0.5) as chosen:
        yield chosen


def entries(task) -> list[StreamEntry]:
    """Step 1's group; then a redelivery of it, a group too stale for step 2, and step 2's group."""
    torch.manual_seed(0)
    sampler = MoETransformer(tiny(vocab_size=task.tokenizer.vocab_size), PrecisionPlan(num_layers=4)).pack()
    first, stale, second = sampled_groups(sampler, [[1, 3, 4], [1, 5], [1, 6, 6]], group_size=4)
    second.policy_version = 1
    return [
        StreamEntry("1-0", first),
        StreamEntry("2-0", first),
        StreamEntry("3-0", stale),
        StreamEntry("4-0", second),
    ]


def test_the_loop_trains_publishes_checkpoints_and_acknowledges_each_step(task, tmp_path):
    torch.manual_seed(0)
    config = TrainerConfig(
        total_steps=2, groups_per_step=1, max_staleness=0, eval_every=1000, checkpoint_dir=tmp_path / "ckpt"
    )
    plan = PrecisionPlan(num_layers=4)
    model = MoETransformer(tiny(vocab_size=task.tokenizer.vocab_size), plan)
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=1e-3)
    stream, recorder = MemoryStream(entries(task)), Recorder()
    settings = TrainerSettings(config, sampler_temperature=1.0, num_samplers=1, provenance={"test": True})
    links = Links(reader=stream, admission=recorder, publisher=recorder)
    policy = Policy(model, optimizer, checkpoint.TrainerState())
    trainer = Trainer(settings, task, policy, links, Metrics("trainer"), tmp_path)

    assert trainer.run() is True

    assert (trainer.state.step, trainer.state.policy_version) == (2, 2)
    assert [v for v, _ in recorder.published] == [1, 2] and recorder.trainer_versions == [1, 2]
    assert all(t.dtype == torch.bfloat16 for _, state in recorder.published for t in state.values())
    # the redelivery is acknowledged untrained, the stale group dropped (its slot back) and acknowledged
    assert sorted(stream.acked) == ["1-0", "2-0", "3-0", "4-0"] and stream.trims == 2 and not stream.dead
    assert recorder.released == 1 and trainer.stale_dropped_total == 4
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert [line["policy_version"] for line in lines[1:]] == [1, 2]
    assert all(line["trained_trajectories"] == 4 and line["loss"] == line["loss"] for line in lines[1:])
    assert lines[2]["eval_accuracy"] is not None and lines[1]["eval_accuracy"] is None  # the last step evaluates
    saved = checkpoint.load_state(checkpoint.latest(config.checkpoint_dir))
    assert (saved.step, saved.policy_version, saved.provenance) == (2, 2, {"test": True})
    assert len(saved.trained) == 8 and len(saved.stale_dropped) == 4


def test_a_resumed_loop_continues_above_the_highest_published_version(task, tmp_path):
    config = TrainerConfig(total_steps=1, groups_per_step=1, checkpoint_dir=tmp_path / "ckpt")
    model = MoETransformer(tiny(vocab_size=task.tokenizer.vocab_size), PrecisionPlan(num_layers=4))
    recorder = Recorder()
    policy = Policy(model, torch.optim.AdamW(model.parameters()), checkpoint.TrainerState(step=3, policy_version=3))
    settings = TrainerSettings(config, sampler_temperature=1.0, num_samplers=1)
    links = Links(admission=recorder, publisher=recorder)
    trainer = Trainer(settings, task, policy, links, Metrics("trainer"), tmp_path)

    trainer.continue_above(5)  # versions 4 and 5 came from steps lost in a crash

    assert [v for v, _ in recorder.published] == [6] and trainer.state.policy_version == 6
