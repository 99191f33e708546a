"""A trainer asked to stop while it evaluates drops the step under way instead of finishing a minute of
decoding: nothing of it is recorded or checkpointed, so a resumed trainer redoes it whole."""

import threading

import pytest
import torch

from nibble.config import load
from nibble.model import MoETransformer, tiny
from nibble.monitoring.metrics import Metrics
from nibble.recipe import PrecisionPlan
from nibble.tasks import get_task
from nibble.tasks.evaluation import EvaluationStopped, accuracy
from nibble.trainer.checkpoint import TrainerState, latest
from nibble.trainer.main import settings
from nibble.trainer.service import Links, Policy, Trainer


@pytest.fixture(scope="module")
def task():
    with get_task("addition", digits=2, eval_size=256, holdout_fraction=0.1) as chosen:
        yield chosen


def test_accuracy_stops_between_batches_when_asked(task):
    model = MoETransformer(tiny(task.tokenizer.vocab_size)).eval()
    asked = []

    def should_stop() -> bool:
        asked.append(True)
        return len(asked) > 1  # let the first batch run, then stop

    with pytest.raises(EvaluationStopped):
        accuracy(model, task, list(task.eval_examples())[:4], batch=2, should_stop=should_stop)
    assert len(asked) == 2


def test_a_stop_during_the_evaluation_leaves_no_record_and_no_checkpoint(task, tmp_path):
    config = load(None, {"NIBBLE_TRAINER__CHECKPOINT_DIR": str(tmp_path / "trainer")})
    model = MoETransformer(tiny(task.tokenizer.vocab_size), PrecisionPlan(num_layers=4))
    optimizer = torch.optim.AdamW(model.parameters())
    stop = threading.Event()
    stop.set()  # SIGTERM arrived: the warm start's evaluation (step 0) is what is under way
    policy = Policy(model, optimizer, TrainerState())
    trainer = Trainer(settings(config), task, policy, Links(), Metrics("trainer"), tmp_path, stop=stop)
    assert trainer.run() is False
    assert not (tmp_path / "metrics.jsonl").exists() and latest(tmp_path / "trainer") is None
