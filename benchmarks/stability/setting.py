"""What a stability grid runs: the RL setting (:class:`Setting`) and the model, task and devices
(:class:`Source`), either the CPU default (the SFT warm start of ``nibble run``) or a run config's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nibble.config import TrainerConfig, load
from nibble.tasks import Task, get_task
from nibble.warmstart.sft import SFT_RECORD, save_warm_start, train_sft

# Trainer fields a Setting owns; a run config's other trainer fields (correction, clipping, …) carry over.
_OWNED = ("total_steps", "groups_per_step", "learning_rate", "max_staleness", "eval_every")
# Trainer fields that place or persist the trainer service, which the grid has no use for.
_SERVICE = (
    "device", "gpu_memory_fraction", "checkpoint_dir", "checkpoint_every", "nproc_per_node", "backend",
    "metrics_port", "metrics_host", "health_port", "threads", "collective_timeout_s", "ledger_size",
)  # fmt: skip


@dataclass(frozen=True)
class Setting:
    """The RL setting, by default made harder than configs/default.yaml so instability has room to appear.

    Attributes:
        steps: trainer steps per run. groups_per_step / group_size: GRPO groups per step and responses
            per group. groups_per_batch: groups generated together with one policy version.
        max_new_tokens: response budget (the 3-digit task needs 5: 4 digits and EOS; a longer budget lets
            a degrading policy ramble). learning_rate: AdamW (default config: 2e-4).
        max_staleness: oldest version a batch may be sampled with (default config: 2).
        eval_every: steps between held-out evaluations (greedy, the trainer's quantised forward).
        eval_size: held-out problems per evaluation (a prefix of the task's fixed evaluation split).
        temperature: sampling and scoring temperature.
        trainer: other ``trainer`` fields of a run config (``{}``: ``TrainerConfig``'s defaults).
    """

    steps: int = 50
    groups_per_step: int = 4
    group_size: int = 8
    groups_per_batch: int = 2
    max_new_tokens: int = 16
    learning_rate: float = 3e-4
    max_staleness: int = 4
    eval_every: int = 5
    eval_size: int = 128
    temperature: float = 1.0
    trainer: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        counts = ("steps", "groups_per_step", "group_size", "groups_per_batch", "max_new_tokens", "eval_every")
        for name in (*counts, "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be ≥ 1")
        if self.groups_per_step % self.groups_per_batch:
            raise ValueError(
                f"groups_per_step={self.groups_per_step} is not a multiple of groups_per_batch="
                f"{self.groups_per_batch}: each step trains whole generation batches"
            )

    def trainer_config(self) -> TrainerConfig:
        return TrainerConfig(
            **self.trainer,
            total_steps=self.steps,
            groups_per_step=self.groups_per_step,
            learning_rate=self.learning_rate,
            max_staleness=self.max_staleness,
            eval_every=self.eval_every,
        )


@dataclass(frozen=True)
class Source:
    """The model and task every run starts from, and where runs compute.

    Attributes:
        checkpoint: an HF-format model directory (a warm start, or an ``nibble import-model`` output).
        task: ``{"name": …, "options": {…}}``, or ``None`` for the task recorded beside an SFT warm start.
        quantize: the plans' ``quantize`` (``experts`` for MoEs, ``all_linear`` for dense models).
        devices: one device per concurrent run (``["cpu"]``, or e.g. ``["cuda:0", "cuda:1"]``).
    """

    checkpoint: Path
    task: dict | None = None
    quantize: str = "experts"
    devices: tuple[str, ...] = ("cpu",)

    def check_model(self) -> None:
        """Refuse a checkpoint that is not a model directory, or a warm start without its task record.

        Raises:
            ValueError: naming the path.
        """
        if not (Path(self.checkpoint) / "config.json").is_file():
            raise ValueError(f"{self.checkpoint}: not a model directory (no config.json)")
        if self.task is None:
            _recorded_task(Path(self.checkpoint))

    def check_devices(self) -> None:
        """Refuse a device this machine does not have.

        Raises:
            ValueError: naming the device.
        """
        for device in self.devices:
            try:
                parsed = torch.device(device)
            except RuntimeError:
                raise ValueError(f"--devices: {device!r} is not a device (cpu, cuda, cuda:N)") from None
            if parsed.type == "cuda" and (
                not torch.cuda.is_available() or (parsed.index or 0) >= torch.cuda.device_count()
            ):
                raise ValueError(
                    f"--devices: {device} is not available here ({torch.cuda.device_count()} CUDA devices)"
                )
            if parsed.type not in ("cpu", "cuda"):
                raise ValueError(f"--devices: {device!r}: runs go on cpu or cuda devices")

    def make_task(self, eval_size: int) -> Task:
        """The task, with ``eval_size`` held-out problems where the task takes that option.

        Raises:
            ValueError: naming the file when a warm start's ``nibble_sft.json`` is missing or malformed.
        """
        if self.task is not None:
            return get_task(self.task["name"], **self.task.get("options", {}))
        spec = _recorded_task(Path(self.checkpoint))
        options = dict(spec.get("options", {}))
        if spec["name"] == "addition":
            options["eval_size"] = eval_size
        return get_task(spec["name"], **options)


def _recorded_task(checkpoint: Path) -> dict:
    """The task ``nibble sft`` recorded beside a warm start.

    Raises:
        ValueError: naming the file when it is missing or malformed.
    """
    record = checkpoint / SFT_RECORD
    try:
        spec = json.loads(record.read_text())["task"]
        spec["name"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{record}: missing or malformed task record ({type(exc).__name__}: {exc})") from None
    return spec


def from_config(path: Path, steps: int, eval_every: int | None, devices: list[str] | None) -> tuple[Source, Setting]:
    """The source and setting of a run config (``nibble run``'s file): its model, task, ``plan.quantize``,
    ``trainer.device`` (unless ``devices``) and sampler/trainer numbers; ``steps`` runs, evaluated every
    ``eval_every`` steps (default: the config's).

    Raises:
        ValueError: from the config loader, naming the file and the field.
    """
    config = load(path)
    s, t = config.sampler, config.trainer
    options = config.task.options
    setting = Setting(
        steps=steps,
        groups_per_step=t.groups_per_step,
        group_size=s.group_size,
        groups_per_batch=s.groups_per_batch,
        max_new_tokens=s.max_new_tokens or options.get("max_response_tokens", Setting.max_new_tokens),
        learning_rate=t.learning_rate,
        max_staleness=t.max_staleness,
        eval_every=t.eval_every if eval_every is None else eval_every,
        eval_size=options.get("eval_size", Setting.eval_size),
        temperature=s.temperature,
        trainer={k: v for k, v in t.model_dump(mode="json").items() if k not in _OWNED + _SERVICE},
    )
    source = Source(
        checkpoint=config.model.checkpoint,
        task={"name": config.task.name, "options": options},
        quantize=config.plan.quantize,
        devices=tuple(devices or [t.device]),
    )
    return source, setting


def ensure_warm_start(checkpoint: Path, seed: int = 0) -> None:
    """Train the default warm start (``nibble run``'s: 3-digit addition, target 0.2) when missing.

    Raises:
        ValueError: ``checkpoint`` is a file, or a non-empty directory that is not a model (never overwritten).
    """
    checkpoint = Path(checkpoint)
    if (checkpoint / "config.json").is_file():
        return
    if checkpoint.exists() and (not checkpoint.is_dir() or any(checkpoint.iterdir())):
        raise ValueError(f"{checkpoint}: neither a warm start (no config.json) nor an empty directory to make one in")
    spec = {"name": "addition", "options": {"digits": 3}}
    with get_task(spec["name"], **spec["options"]) as task:
        model, result = train_sft(task, target_accuracy=0.2, seed=seed)
    save_warm_start(model, result, spec, Path(checkpoint))
    print(f"warm start trained: {result.steps} steps, held-out accuracy {result.eval_accuracy:.3f}", flush=True)
