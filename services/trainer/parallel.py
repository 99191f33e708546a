"""How the trainer's work is spread over processes: the one interface the step, the loop and checkpoints use.

:class:`SingleProcess` is one process holding the whole model; :class:`nibble.trainer.sharded.Shard` is one
of ``torchrun``'s ranks with the model FSDP2-sharded. Everything the trainer does differently across
processes goes through these methods, so the trainer itself has one code path.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from nibble.model import MoETransformer
from nibble.model.scoring import Scores, score
from nibble.recipe.export import published_state

if TYPE_CHECKING:
    from nibble.trainer.batch import Batch

OPTIMIZER_FILE = "optimizer.safetensors"
"""A single-process checkpoint's AdamW state (safetensors)."""
SHARDED_DIR = "sharded"
"""The folder of a sharded checkpoint that holds its model and optimiser (``torch.distributed.checkpoint``)."""


class Parallelism:
    """The trainer's processes, seen from one of them.

    Attributes:
        leader: whether this process talks to the outside (reads the stream, publishes, acknowledges,
            records metrics); exactly one process leads.
        sharded: whether checkpoints hold ``torch.distributed.checkpoint`` shards (else safetensors).
        stops_early: whether evaluation may stop between batches on its own (sharded ranks decode in
            collectives, so they run every batch together).
    """

    leader: bool
    sharded: bool
    stops_early: bool

    def prepare_model(self, model: MoETransformer, device: torch.device | None) -> MoETransformer:
        """``model`` placed for training (moved to ``device``, or sharded)."""
        raise NotImplementedError

    def model_source(self, resume: Path | None, warm_start: Path) -> Path:
        """Where the model's weights are read from before the checkpoint's optimiser state is loaded."""
        raise NotImplementedError

    def score(self, model: MoETransformer, batch: Batch) -> Scores:
        """Teacher-forced scores of the whole ``batch`` (``[B, R]`` like ``batch.mask``) on every process."""
        raise NotImplementedError

    def update_rows(
        self, batch: Batch, groups: list[int], correction_level: str
    ) -> tuple[torch.Tensor, float, int | None]:
        """This process's rows of one update over ``groups``, their loss weight, and the update's valid-token
        count when the loss must divide by the whole update's (``None``: the rows are the whole update)."""
        raise NotImplementedError

    def update_stats(self, stats: dict[str, float], share: float) -> dict[str, float]:
        """One process's :func:`nibble.rl.policy_loss` stats made the whole update's."""
        raise NotImplementedError

    def all_finite(self, finite: bool) -> bool:
        """Whether every process's loss is finite (all take the same branch: the backward is collective)."""
        raise NotImplementedError

    def backward_scale(self) -> float:
        """Factor for the loss before ``backward`` so gradients sum the processes' shares."""
        raise NotImplementedError

    def all_sum(self, value: float) -> float:
        """``value`` summed over processes."""
        raise NotImplementedError

    def full_norm(self, norm: torch.Tensor) -> float:
        """A gradient norm (maybe a DTensor) as a plain float."""
        raise NotImplementedError

    def broadcast(self, obj: Any) -> Any:
        """The leader's ``obj`` on every process."""
        raise NotImplementedError

    def published_state(self, model: MoETransformer) -> dict[str, torch.Tensor]:
        """The publication (bf16 CPU tensors by name) on the leader, empty elsewhere."""
        raise NotImplementedError

    def save_weights(self, model: MoETransformer, optimizer: torch.optim.Optimizer, path: Path) -> None:
        """Write model and optimiser into checkpoint directory ``path`` (every process calls this)."""
        raise NotImplementedError

    def load_weights(self, path: Path, model: MoETransformer, optimizer: torch.optim.Optimizer) -> None:
        """Restore what :meth:`save_weights` wrote into ``model`` and ``optimizer``.

        Raises:
            ValueError: the checkpoint's files are missing or damaged.
        """
        raise NotImplementedError

    def barrier(self) -> None:
        """Wait until every process arrives here."""
        raise NotImplementedError

    def close(self) -> None:
        """Leave the group of processes once every one is done."""
        raise NotImplementedError


class SingleProcess(Parallelism):
    """One process, the whole model: collectives are identities."""

    leader = True
    sharded = False
    stops_early = True

    def prepare_model(self, model: MoETransformer, device: torch.device | None) -> MoETransformer:
        return model.to(device)

    def model_source(self, resume: Path | None, warm_start: Path) -> Path:
        return resume if resume is not None else warm_start

    def score(self, model: MoETransformer, batch: Batch) -> Scores:
        return score(model, batch.prompts, batch.responses, temperature=batch.temperature)

    def update_rows(self, batch: Batch, groups: list[int], correction_level: str) -> tuple[torch.Tensor, float, None]:
        return batch.rows_of_groups(groups), 1.0, None

    def update_stats(self, stats: dict[str, float], share: float) -> dict[str, float]:
        return stats

    def all_finite(self, finite: bool) -> bool:
        return finite

    def backward_scale(self) -> float:
        return 1.0

    def all_sum(self, value: float) -> float:
        return value

    def full_norm(self, norm: torch.Tensor) -> float:
        return float(norm)

    def broadcast(self, obj: Any) -> Any:
        return obj

    def published_state(self, model: MoETransformer) -> dict[str, torch.Tensor]:
        return published_state(model)

    def save_weights(self, model: MoETransformer, optimizer: torch.optim.Optimizer, path: Path) -> None:
        model.save_pretrained(path)
        save_file(_optimizer_tensors(model, optimizer), str(Path(path) / OPTIMIZER_FILE))

    def load_weights(self, path: Path, model: MoETransformer, optimizer: torch.optim.Optimizer) -> None:
        """Restore AdamW moments and step counts (on each parameter's device); the weights themselves were
        loaded with the model (:meth:`model_source`)."""
        tensors = load_file(str(Path(path) / OPTIMIZER_FILE))
        names = {id(p): n for n, p in model.named_parameters()}
        for group in optimizer.param_groups:
            for param in group["params"]:
                name = names[id(param)]
                if f"{name}::exp_avg" not in tensors:
                    continue
                optimizer.state[param] = {
                    "step": tensors[f"{name}::step"].clone(),
                    "exp_avg": tensors[f"{name}::exp_avg"].to(param.device),
                    "exp_avg_sq": tensors[f"{name}::exp_avg_sq"].to(param.device),
                }

    def barrier(self) -> None:
        pass  # one process: nobody to wait for

    def close(self) -> None:
        pass  # no process group was joined


SINGLE_PROCESS = SingleProcess()
"""The single-process trainer's parallelism (stateless, shared)."""


def _optimizer_tensors(model: MoETransformer, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in model.named_parameters():
        state = optimizer.state.get(param)
        if not state:
            continue
        out[f"{name}::exp_avg"] = state["exp_avg"].detach().cpu().contiguous()
        out[f"{name}::exp_avg_sq"] = state["exp_avg_sq"].detach().cpu().contiguous()
        out[f"{name}::step"] = torch.as_tensor(state["step"], dtype=torch.float32).reshape(1).cpu()
    return out
