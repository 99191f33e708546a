"""The FSDP2-sharded trainer on 2 processes equals the single-process trainer: on CPUs over gloo (CI) and
on 2 GPUs over NCCL against one GPU (the multi-GPU machine).

Same initial weights and batches, 3 consumed batches of 2 updates each (one update leaves a rank without
groups): the losses and the final weights agree within 1e-5; a sharded checkpoint loads back exactly.
"""

import os

import pytest
import torch
import torch.multiprocessing as mp

from nibble.config import TrainerConfig
from nibble.launcher import free_port
from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan, param_groups
from nibble.trainer import sharded
from nibble.trainer.batch import assemble
from nibble.trainer.step import train_on_batch
from tests.trainer.test_step import sampled_groups

WORLD = 2
CONFIG = TrainerConfig(updates_per_batch=2)
LR = 2e-4  # the main job's learning rate


def _model() -> tuple[MoETransformer, PrecisionPlan]:
    plan = PrecisionPlan(num_layers=4)
    return MoETransformer(tiny(vocab_size=16), plan), plan


def _batches(model: MoETransformer):
    sampler, _ = _model()
    sampler.load_state_dict(model.state_dict())
    sampler.pack()
    prompt_sets = [
        [[1, 3, 4], [1, 5], [1, 6, 6], [1, 7]],
        [[1, 4], [1, 3, 3], [1, 9]],
        [[1, 8], [1, 2, 5], [1, 5, 5], [1, 6]],
    ]
    batches = [assemble(sampled_groups(sampler, prompts, group_size=4), trainer_version=0) for prompts in prompt_sets]
    for batch in batches:  # rewards that differ inside every group, so every update has a gradient
        batch.rewards = (torch.arange(len(batch.rewards)) % 3 == 0).to(torch.float32)
    return batches


def _worker(rank: int, port: int, state: dict, batches: list, out: str, device: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    shard = sharded.init_process_group(device)
    model, plan = _model()
    model.load_state_dict(state)
    sharded.shard_model(model)
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=LR)
    results = [train_on_batch(model, optimizer, batch, CONFIG, parallel=shard) for batch in batches]
    losses = [r.loss for r in results]
    counts = [(r.trained_tokens, r.stats) for r in results]
    full = sharded.full_state(model)
    sharded.save_checkpoint(model, optimizer, os.path.join(out, "ckpt"))
    restored, _ = _model()
    sharded.shard_model(restored)
    restored_optimizer = torch.optim.AdamW(param_groups(restored, plan, 0.0), lr=LR)
    sharded.load_checkpoint(restored, restored_optimizer, os.path.join(out, "ckpt"))
    reloaded = sharded.full_state(restored)
    if shard.rank == 0:
        result = {"losses": losses, "counts": counts, "state": full, "reloaded": reloaded}
        torch.save(result, os.path.join(out, "result.pt"))
    sharded.close()


DEVICES = [
    pytest.param("cpu", id="gloo"),
    pytest.param(
        "cuda",
        id="nccl",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason=f"needs {WORLD} CUDA devices"),
        ],
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_two_ranks_train_exactly_like_one_process(tmp_path, device):
    torch.manual_seed(0)
    model, plan = _model()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    batches = _batches(model)
    model.to(device)
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=LR)
    results = [train_on_batch(model, optimizer, batch, CONFIG) for batch in batches]
    losses = [r.loss for r in results]

    mp.start_processes(
        _worker, args=(free_port(), initial, batches, str(tmp_path), device), nprocs=WORLD, start_method="spawn"
    )
    result = torch.load(tmp_path / "result.pt")
    print(f"{device}: losses {losses} vs sharded {result['losses']}")
    assert result["losses"] == pytest.approx(losses, abs=1e-5)
    for (tokens, stats), single in zip(result["counts"], results, strict=True):
        assert tokens == single.trained_tokens  # the whole update's tokens, not rank 0's share
        assert stats == pytest.approx(single.stats, rel=1e-4, abs=1e-6)
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    assert set(result["state"]) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(result["state"][name], value, atol=1e-5, rtol=0, msg=name)
        assert torch.equal(result["reloaded"][name], result["state"][name]), name
    worst = max(float((result["state"][k] - v).abs().max()) for k, v in expected.items())
    print(f"{device}: largest weight difference {worst:.3g}")
    moved = max(float((expected[k] - initial[k]).abs().max()) for k in expected)
    assert moved > 1e-4  # the comparison is not between two untouched models


def test_a_sharded_trainer_outside_torchrun_is_refused(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="torchrun --nproc-per-node"):
        sharded.init_process_group()
