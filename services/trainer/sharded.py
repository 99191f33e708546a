"""The trainer across processes: FSDP2 (``torch.distributed.fsdp.fully_shard``) over the decoder layers.

Every rank holds the whole consumed batch (rank 0 reads the stream and broadcasts it) and trains on its
own share of whole groups. Each rank's loss is divided by the valid-token count of the whole update
(DESIGN.md §4) and the gradients are summed over ranks (FSDP averages them, so each backward is scaled
by the world size): the update equals the single-process one. Parameters, gradients and AdamW state are
sharded; the recipe is unchanged: each rank's forward all-gathers a layer's float32 master weights and
quantises them as one process would. Run under ``torchrun --nproc-per-node N`` (NCCL on GPUs, gloo on
CPUs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from nibble.model import MoETransformer

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Shard:
    """This process's place among the trainer's ranks."""

    rank: int
    world_size: int

    def local_groups(self, groups: list[int]) -> list[int]:
        """This rank's contiguous share of whole groups (ranks beyond the group count get none)."""
        per = -(-len(groups) // self.world_size)
        return groups[self.rank * per : (self.rank + 1) * per]


def init_process_group() -> Shard:
    """Join the process group that ``torchrun`` describes in the environment (NCCL with CUDA, else gloo).

    Raises:
        ValueError: a torchrun variable is missing (start the trainer with ``torchrun --nproc-per-node N``).
    """
    missing = [name for name in _TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise ValueError(f"sharded trainer: {', '.join(missing)} not set; start it with torchrun --nproc-per-node N")
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Shard(dist.get_rank(), dist.get_world_size())


def shard_model(model: MoETransformer) -> MoETransformer:
    """Shard ``model`` in place: one FSDP unit per decoder layer plus the root (embeddings, norm, head)."""
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def backward_scale(shard: Shard) -> float:
    """Factor for each rank's loss before ``backward``: FSDP averages gradients over ranks, while the
    losses are already divided by the whole update's token count and must be summed."""
    return float(shard.world_size)


def all_sum(value: float) -> float:
    """Sum of ``value`` over ranks (float64)."""
    t = torch.tensor([value], dtype=torch.float64, device=_device())
    dist.all_reduce(t)
    return float(t.item())


def broadcast(obj: object) -> object:
    """Rank 0's ``obj`` on every rank (pickled through the process group)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def full_norm(norm: torch.Tensor) -> float:
    """A gradient norm that may be a DTensor (sharded gradients) as a plain float."""
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def full_state(model: MoETransformer) -> dict[str, torch.Tensor]:
    """The whole model's float32 state on rank 0's CPU (empty on other ranks), gathered one parameter at
    a time, so no GPU ever holds the whole model; this is what the trainer publishes."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def save_checkpoint(model: MoETransformer, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Sharded checkpoint of model and optimiser (``torch.distributed.checkpoint``): each rank writes its
    shards; readable with any number of ranks."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))


def load_checkpoint(model: MoETransformer, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Load a :func:`save_checkpoint` directory into an already sharded model and its optimiser.

    Raises:
        FileNotFoundError: ``path`` holds no checkpoint metadata.
    """
    if not (Path(path) / ".metadata").exists():
        raise FileNotFoundError(f"{path}: no torch.distributed.checkpoint metadata (.metadata) there")
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
