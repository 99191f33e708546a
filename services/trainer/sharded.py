"""The trainer across processes: FSDP2 (``torch.distributed.fsdp.fully_shard``) over the decoder layers.

Every rank holds the whole consumed batch (rank 0 reads the stream and broadcasts it) and trains on its
own share of whole groups. Each rank's loss is divided by the valid-token count of the whole update
(docs/design.md §4) and the gradients are summed over ranks (FSDP averages them, so each backward is scaled
by the world size): the update equals the single-process one. Parameters, gradients and AdamW state are
sharded; the recipe is unchanged: each rank's forward all-gathers a layer's float32 master weights and
quantises them as one process would. Run under ``torchrun --nproc-per-node N`` (NCCL on GPUs, gloo on
CPUs).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from nibble.model import MoETransformer
from nibble.model.hf import write_config
from nibble.model.scoring import Scores, score
from nibble.rl import valid_token_mask
from nibble.trainer.batch import Batch
from nibble.trainer.parallel import SHARDED_DIR, Parallelism

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Shard(Parallelism):
    """This process's place among the trainer's ranks: the sharded :class:`Parallelism`.

    Every rank holds the whole batch and trains on its own share of whole groups; rank 0 leads.
    """

    rank: int
    world_size: int
    sharded = True
    stops_early = False  # every rank decodes the same examples with a fixed number of (collective) forwards

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def local_groups(self, groups: list[int]) -> list[int]:
        """This rank's contiguous share of whole groups (ranks beyond the group count get none)."""
        per = -(-len(groups) // self.world_size)
        return groups[self.rank * per : (self.rank + 1) * per]

    def prepare_model(self, model: MoETransformer, device: torch.device | None) -> MoETransformer:
        """Shard ``model`` (:func:`shard_model`); FSDP places each rank's shard, ``device`` is unused."""
        return shard_model(model)

    def model_source(self, resume: Path | None, warm_start: Path) -> Path:
        """The warm start: every rank loads it and keeps its shard, then the checkpoint's shards replace it."""
        return warm_start

    def score(self, model: MoETransformer, batch: Batch) -> Scores:
        """Each rank scores its own share of the groups; the ranks' disjoint rows are summed into the whole
        batch on every rank (adding zeros is exact)."""
        rows, share = self._local_rows(batch, range(batch.num_groups))
        part = score(
            model, [batch.prompts[i] for i in rows], [batch.responses[i] for i in rows], temperature=batch.temperature
        )
        whole = []
        for values in (part.logprobs, part.entropy):
            out = values.new_zeros(batch.mask.shape)
            if share:
                out[rows, : values.shape[1]] = values
            whole.append(sum_(out))
        return Scores(logprobs=whole[0], entropy=whole[1], mask=batch.mask)

    def update_rows(self, batch: Batch, groups: list[int], correction_level: str) -> tuple[torch.Tensor, float, int]:
        """This rank's rows; the loss divides by the whole update's valid tokens (see the module docstring)."""
        rows = batch.rows_of_groups(groups)
        level = correction_level
        num_valid = int(valid_token_mask(batch.sampler_logprobs[rows], batch.mask[rows], correction_level=level).sum())
        return (*self._local_rows(batch, groups), num_valid)

    def update_stats(self, stats: dict[str, float], share: float) -> dict[str, float]:
        """Token counts summed over ranks, per-token means re-weighted by each rank's valid tokens (a rank
        weighted 0 contributes nothing)."""
        counts = ("valid_tokens", "rejected_tokens")
        means = [key for key in stats if key not in counts]
        valid = stats["valid_tokens"] * share
        sums = all_sums([valid, stats["rejected_tokens"] * share, *(stats[key] * valid for key in means)])
        total = max(sums[0], 1.0)
        return {
            "valid_tokens": int(sums[0]),
            "rejected_tokens": int(sums[1]),
            **{key: value / total for key, value in zip(means, sums[2:], strict=True)},
        }

    def all_finite(self, finite: bool) -> bool:
        return all_sum(0.0 if finite else 1.0) == 0.0

    def backward_scale(self) -> float:
        """FSDP averages gradients over ranks, while the losses are already divided by the whole update's
        token count and must be summed."""
        return float(self.world_size)

    def all_sum(self, value: float) -> float:
        return all_sum(value)

    def full_norm(self, norm: torch.Tensor) -> float:
        return full_norm(norm)

    def broadcast(self, obj: object) -> object:
        return broadcast(obj)

    def published_state(self, model: MoETransformer) -> dict[str, torch.Tensor]:
        return published_state(model)

    def save_weights(self, model: MoETransformer, optimizer: torch.optim.Optimizer, path: Path) -> None:
        """Model and optimiser under ``path/sharded`` (every rank its shards), ``config.json`` by rank 0."""
        barrier()  # the stale temporary directory is gone before any rank writes
        save_checkpoint(model, optimizer, Path(path) / SHARDED_DIR)
        if self.leader:
            write_config(model.config, path)

    def load_weights(self, path: Path, model: MoETransformer, optimizer: torch.optim.Optimizer) -> None:
        """Any number of ranks: ``torch.distributed.checkpoint`` reshards.

        Raises:
            ValueError: the checkpoint's files are missing or damaged.
        """
        try:
            load_checkpoint(model, optimizer, Path(path) / SHARDED_DIR)
        except (OSError, RuntimeError, AssertionError, ValueError, CheckpointException) as exc:  # DCP's failures
            raise ValueError(
                f"{path}: unreadable sharded checkpoint ({type(exc).__name__}: {exc}); move it aside to resume "
                "from the checkpoint before it"
            ) from exc

    def barrier(self) -> None:
        barrier()

    def close(self) -> None:
        close()

    def _local_rows(self, batch: Batch, groups) -> tuple[torch.Tensor, float]:
        """This rank's rows of ``groups`` and their weight; a rank without groups still joins the
        collectives (every forward all-gathers) on one row weighted 0."""
        local = batch.rows_of_groups(self.local_groups(list(groups)))
        return (local, 1.0) if len(local) else (batch.rows_of_groups(groups)[:1], 0.0)


def launched_by_torchrun() -> bool:
    """Whether this process is one of several that ``torchrun`` started (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_process_group(device: str = "cpu", timeout_s: float = 3600.0) -> Shard:
    """Join the process group that ``torchrun`` describes in the environment: NCCL with each rank on GPU
    ``LOCAL_RANK`` for ``device="cuda"``, gloo for ``"cpu"``. A collective that waits longer than
    ``timeout_s`` seconds fails (the other ranks wait in one while rank 0 reads a batch from the stream, so
    this must exceed the samplers' slowest batch).

    Raises:
        ValueError: a torchrun variable is missing (start the trainer with ``torchrun --nproc-per-node N``),
            an unknown ``device``, or ``"cuda"`` without a GPU for this rank.
    """
    missing = [name for name in _TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise ValueError(f"sharded trainer: {', '.join(missing)} not set; start it with torchrun --nproc-per-node N")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"sharded trainer: device={device!r}; expected 'cpu' or 'cuda'")
    if not dist.is_initialized():
        if device == "cuda":
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            if local_rank >= torch.cuda.device_count():
                raise ValueError(
                    f"sharded trainer: rank needs GPU {local_rank} but {torch.cuda.device_count()} are visible "
                    "(trainer.nproc_per_node must not exceed the GPUs of the node)"
                )
            torch.cuda.set_device(local_rank)
        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return Shard(dist.get_rank(), dist.get_world_size())


def shard_model(model: MoETransformer) -> MoETransformer:
    """Shard ``model`` in place: one FSDP unit per decoder layer plus the root (embeddings, norm, head).
    FSDP moves each unit's shard to this rank's device (the GPU of ``LOCAL_RANK`` under NCCL), one
    unit at a time, so the whole model never sits on one GPU."""
    mesh = init_device_mesh(_device().type, (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def all_sums(values: list[float]) -> list[float]:
    """Element-wise sums of ``values`` over ranks (float64, one collective)."""
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t)
    return t.tolist()


def all_sum(value: float) -> float:
    """Sum of ``value`` over ranks (float64)."""
    return all_sums([value])[0]


def sum_(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over ranks, in place (returned for chaining)."""
    dist.all_reduce(tensor)
    return tensor


def broadcast(obj: object) -> object:
    """Rank 0's ``obj`` on every rank (pickled through the process group)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def full_norm(norm: torch.Tensor) -> float:
    """A gradient norm that may be a DTensor (sharded gradients) as a plain float."""
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def published_state(model: MoETransformer) -> dict[str, torch.Tensor]:
    """The trainer's publication (as :func:`nibble.recipe.export.published_state`: every parameter's bf16
    cast, CPU, contiguous) on rank 0, empty elsewhere. Gathered one parameter at a time and cast to bf16
    at once, so no GPU holds more than one whole parameter and rank 0's CPU never the float32 model."""
    out = {}
    for name, param in model.named_parameters():
        value = param.detach()
        value = value.full_tensor() if isinstance(value, DTensor) else value  # collective: every rank
        if dist.get_rank() == 0:
            out[name] = value.to(torch.bfloat16).cpu().contiguous()
        del value
    return out


def full_state(model: MoETransformer) -> dict[str, torch.Tensor]:
    """The whole model's float32 state dict on rank 0's CPU (empty on other ranks), gathered one parameter
    at a time, so no GPU ever holds the whole model (for inspection and tests; the trainer publishes
    :func:`published_state`)."""
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


def close() -> None:
    """Leave the process group once every rank is done with it (a rank tearing gloo down while a peer is
    still in a collective can abort the peer)."""
    dist.barrier()
    dist.destroy_process_group()


def barrier() -> None:
    """Wait until every rank arrives here."""
    dist.barrier()


def _device() -> torch.device:
    """This rank's device: its GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
