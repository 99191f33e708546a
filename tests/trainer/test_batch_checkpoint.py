"""Batch assembly from wire groups, and checkpoints that survive a restart."""

import pytest
import torch

from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan, param_groups
from nibble.trainer import checkpoint
from nibble.trainer.batch import assemble
from nibble.wire import pb


def group(version: int, rewards, lengths, temperature=1.0, prefix="s"):
    g = pb.TrajectoryGroup(
        group_id=f"{prefix}g{version}",
        example_id="e",
        prompt_tokens=[1, 5, 6],
        policy_version=version,
        sampler_id=prefix,
        temperature=temperature,
    )
    for i, (reward, n) in enumerate(zip(rewards, lengths, strict=True)):
        g.responses.add(
            trajectory_id=f"{prefix}{version}-{i}",
            tokens=list(range(3, 3 + n)),
            logprobs=[-0.5] * n,
            reward=reward,
            finish_reason=pb.STOP if n < 4 else pb.LENGTH,
        )
    return g


def test_assemble_pads_rows_and_keeps_groups_whole():
    batch = assemble([group(3, [1.0, 0.0], [2, 4]), group(4, [0.0, 0.0, 1.0], [1, 1, 3], prefix="t")], 5)
    assert batch.sampler_logprobs.shape == (5, 4) and batch.mask.sum() == 2 + 4 + 1 + 1 + 3
    assert batch.group_index.tolist() == [0, 0, 1, 1, 1]
    assert batch.staleness.tolist() == [2, 2, 1, 1, 1]
    assert batch.truncated.tolist() == [False, True, False, False, False]
    assert batch.rows_of_groups([1]).tolist() == [2, 3, 4]
    assert batch.trajectory_ids[0] == "s3-0" and batch.num_groups == 2


def test_assemble_refuses_mixed_temperatures_and_empty_batches():
    with pytest.raises(ValueError, match="temperatures"):
        assemble([group(1, [1, 0], [1, 1]), group(1, [1, 0], [1, 1], temperature=0.7, prefix="t")], 1)
    with pytest.raises(ValueError, match="no groups"):
        assemble([], 0)


def test_ledger_is_bounded_and_ordered():
    ledger = checkpoint.Ledger(3, ["a", "b"])
    for x in ("c", "d"):
        ledger.add(x)
    assert ledger.ids() == ["b", "c", "d"] and "a" not in ledger and "d" in ledger


def test_checkpoint_round_trip_restores_model_optimizer_and_counters(tmp_path):
    torch.manual_seed(0)
    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=4)
    model = MoETransformer(config, plan)
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.01), lr=1e-3)
    model(torch.randint(1, 32, (2, 5))).sum().backward()
    optimizer.step()
    state = checkpoint.TrainerState(
        step=7, policy_version=7, trained=["x", "y"], stale_dropped=["z"], eval_accuracy=0.5
    )
    path = checkpoint.save(tmp_path, model, optimizer, state)
    assert checkpoint.latest(tmp_path) == path
    from nibble.model import from_pretrained

    restored = from_pretrained(path, plan=plan)
    optimizer2 = torch.optim.AdamW(param_groups(restored, plan, 0.01), lr=1e-3)
    checkpoint.load_weights(path, restored, optimizer2)
    assert checkpoint.load_state(path) == state
    for (name, p), (_, q) in zip(model.named_parameters(), restored.named_parameters(), strict=True):
        assert torch.equal(p, q), name
        assert torch.equal(optimizer.state[p]["exp_avg"], optimizer2.state[q]["exp_avg"]), name
    assert not list(tmp_path.glob(".tmp-*"))


def test_latest_is_none_without_a_checkpoint(tmp_path):
    assert checkpoint.latest(tmp_path) is None


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    model = MoETransformer(tiny(vocab_size=16))
    optimizer = torch.optim.AdamW(model.parameters())
    for step in range(1, 5):
        path = checkpoint.save(tmp_path, model, optimizer, checkpoint.TrainerState(step=step))
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000004"]
    assert checkpoint.latest(tmp_path) == path and checkpoint.load_state(path).step == 4


def _saved_steps(directory, steps):
    model = MoETransformer(tiny(vocab_size=16))
    optimizer = torch.optim.AdamW(model.parameters())
    return [checkpoint.save(directory, model, optimizer, checkpoint.TrainerState(step=s)) for s in steps]


def test_an_incomplete_latest_checkpoint_falls_back_to_the_one_before(tmp_path):
    older, newest = _saved_steps(tmp_path, [1, 2])
    (newest / checkpoint.STATE_FILE).unlink()  # a damaged disk, a crash between writes
    assert checkpoint.latest(tmp_path) == older
    (tmp_path / "latest").unlink()  # a crash before the pointer moved
    assert checkpoint.latest(tmp_path) == older


def test_checkpoints_of_which_none_is_complete_are_refused_not_replaced(tmp_path):
    saved = _saved_steps(tmp_path, [1, 2])
    (saved[0] / checkpoint.OPTIMIZER_FILE).unlink()
    (saved[1] / checkpoint.STATE_FILE).unlink()
    with pytest.raises(ValueError, match="no complete checkpoint"):
        checkpoint.latest(tmp_path)
    assert all(path.is_dir() for path in saved)
