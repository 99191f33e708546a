"""The run's composite: every section, and the checks that need more than one of them (admission, placement,
SGLang)."""

from __future__ import annotations

from pydantic import Field, model_validator

from nibble.config import devices
from nibble.config.admission import allowed_groups
from nibble.config.base import Section
from nibble.config.model import ModelSection, PlanConfig
from nibble.config.sampler import SamplerConfig
from nibble.config.stream import RedisConfig
from nibble.config.task import TaskConfig
from nibble.config.trainer import TrainerConfig
from nibble.config.weightsync import WeightSyncConfig


class RunConfig(Section):
    """A whole run: what ``nibble run`` launches and every service reads its section of."""

    seed: int = 0
    num_samplers: int = Field(
        2, ge=1, description="samplers `nibble run` starts; the trainer counts live ones (heartbeats), not this"
    )
    model: ModelSection = ModelSection()
    task: TaskConfig = TaskConfig()
    plan: PlanConfig = PlanConfig()
    redis: RedisConfig = RedisConfig()
    weightsync: WeightSyncConfig = WeightSyncConfig()
    sampler: SamplerConfig = SamplerConfig()
    trainer: TrainerConfig = TrainerConfig()

    @model_validator(mode="after")
    def _can_make_progress(self) -> RunConfig:
        t, r = self.trainer, self.redis
        if r.queue_capacity < t.groups_per_step:
            raise ValueError(
                f"redis.queue_capacity={r.queue_capacity} < trainer.groups_per_step={t.groups_per_step}: "
                "samplers would pause before the trainer has a full batch"
            )
        # At version 0 the rule gives one version's window: what samplers may start before a publication.
        allowed = allowed_groups(0, t.max_staleness, t.groups_per_step * t.publish_every)
        if self.sampler.groups_per_batch > allowed:
            raise ValueError(
                f"sampler.groups_per_batch={self.sampler.groups_per_batch} exceeds what admission control allows "
                f"per version ((max_staleness + 1) x groups_per_step x publish_every = {allowed})"
            )
        self._check_placement()
        self._check_sglang()
        if t.groups_per_step % t.updates_per_batch:
            raise ValueError(
                f"trainer.groups_per_step={t.groups_per_step} is not divisible by "
                f"trainer.updates_per_batch={t.updates_per_batch} (each update takes whole groups)"
            )
        return self

    @property
    def plan_device(self) -> str:
        """The device kind ``plan.compute_dtype: auto`` resolves for on every service: the trainer's (bfloat16
        when it is on CUDA, float32 on the CPU). A CPU sampler of a CUDA trainer then computes in bfloat16
        too, so both sides round alike and publish the same plan."""
        return "cpu" if self.trainer.device == "cpu" else "cuda"

    def _check_sglang(self) -> None:
        """SGLang servers load every version from weight-sync's NVFP4 export, one server per sampler."""
        s = self.sampler
        if s.engine != "sglang":
            return
        if self.weightsync.export_format == "none":
            raise ValueError(
                "sampler.engine=sglang loads each version from weight-sync's export: set weightsync.export_format "
                "(compressed-tensors or modelopt) and weightsync.export_dir to a path the SGLang servers read"
            )
        if self.plan.format != "nvfp4":
            raise ValueError(
                f"sampler.engine=sglang samples from weight-sync's NVFP4 export; plan.format={self.plan.format} "
                "has no such export (use sampler.engine: builtin)"
            )
        if len(s.sglang_urls) != self.num_samplers:
            raise ValueError(
                f"sampler.sglang_urls has {len(s.sglang_urls)} servers for num_samplers={self.num_samplers}: each "
                "sampler drives its own server (two would swap each other's weights)"
            )

    def _check_placement(self) -> None:
        """torchrun ranks take ``cuda``; GPUs shared by several services must not be promised more than their
        memory."""
        t, s = self.trainer, self.sampler
        if t.nproc_per_node > 1 and t.device not in ("cpu", "cuda"):
            raise ValueError(
                f"trainer.device={t.device} with trainer.nproc_per_node={t.nproc_per_node}: torchrun gives each "
                "rank its GPU; use trainer.device=cuda"
            )
        shares: dict[int, float] = {}
        for device, fraction, count in (
            (t.device, t.gpu_memory_fraction, t.nproc_per_node),
            (s.device, s.gpu_memory_fraction, self.num_samplers),
        ):
            index = devices.gpu_index(device)
            if index is not None and fraction is not None:
                shares[index] = shares.get(index, 0.0) + fraction * count
        for index, total in shares.items():
            if total > 1.0 + 1e-9:
                raise ValueError(
                    f"GPU {index} is promised {total:.2f} of its memory (trainer.gpu_memory_fraction + "
                    "num_samplers x sampler.gpu_memory_fraction on it); the shares must add up to at most 1"
                )
