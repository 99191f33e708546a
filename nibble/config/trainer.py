"""The trainer's section: batches, objective, optimiser, publishing, checkpoints, placement."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from nibble.config.base import Device, MemoryFraction, Section


class TrainerConfig(Section):
    """The trainer: batches, objective (docs/design.md §4), optimiser, publishing, checkpoints."""

    total_steps: int = Field(450, ge=1)
    groups_per_step: int = Field(8, ge=1, description="whole GRPO groups per consumed batch")
    updates_per_batch: int = Field(1, ge=1)
    learning_rate: float = Field(2e-4, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    clip_low: float = Field(0.2, ge=0, lt=1)
    clip_high: float = Field(0.28, ge=0)
    correction: Literal["tis", "mis", "rs", "none"] = "tis"
    correction_level: Literal["token", "sequence", "geometric"] = "token"
    cap: float = Field(2.0, gt=1)
    kl_coef: float = Field(0.0, ge=0)
    max_staleness: int = Field(2, ge=0)
    drop_zero_std_groups: bool = False
    publish_every: int = Field(1, ge=1)
    eval_every: int = Field(20, ge=1)
    checkpoint_every: int = Field(1, ge=1, description="entries are acknowledged only once checkpointed")
    checkpoint_dir: Path = Path("runs/trainer")
    ledger_size: int = Field(1_000_000, ge=1, description="trained trajectory_ids remembered in the checkpoint")
    threads: int = Field(1, ge=1)
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_host: str = Field("127.0.0.1", description="address /metrics binds; 0.0.0.0 in a pod Prometheus scrapes")
    health_port: int | None = Field(
        None, ge=1, le=65535, description="gRPC health checking on metrics_host (containers); None: not served"
    )
    device: Device = Field("cpu", description="cuda / cuda:N; under torchrun (nproc_per_node > 1) cuda only")
    gpu_memory_fraction: MemoryFraction = Field(
        None, description="share of the GPU's memory the trainer may allocate (when it shares the GPU)"
    )
    nproc_per_node: int = Field(
        1, ge=1, description="trainer processes (torchrun --nproc-per-node); above 1, FSDP2 shards the model"
    )
    collective_timeout_s: float = Field(
        3600.0, gt=0, description="sharded: how long ranks wait in a collective, e.g. for rank 0's next batch"
    )
    backend: Literal["nibble", "transformer_engine"] = Field(
        "nibble",
        description="nibble: Nibble's NVFP4 modules (CPU, any CUDA GPU); transformer_engine: TE's NVFP4 recipe, "
        "which needs TE's compiled core and a Blackwell GPU (not built yet: refused at start-up, naming what is "
        "missing)",
    )

    @model_validator(mode="after")
    def _backend_has_a_device(self) -> TrainerConfig:
        if self.backend == "transformer_engine" and self.device == "cpu":
            raise ValueError(
                "trainer.backend=transformer_engine needs trainer.device: cuda on a Blackwell GPU (Transformer "
                "Engine's NVFP4 recipe refuses the CPU and Hopper), and is not built yet; use trainer.backend: nibble"
            )
        return self
