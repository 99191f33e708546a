"""What a stability grid runs: the RL setting (:class:`Setting`) and the model, task and devices
(:class:`Source`), either the CPU default (the SFT warm start of ``nibble run``) or a run config's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

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

    def make_task(self, eval_size: int) -> Task:
        """The task, with ``eval_size`` held-out problems where the task takes that option.

        Raises:
            ValueError: naming the file when a warm start's ``nibble_sft.json`` is missing or malformed.
        """
        if self.task is not None:
            return get_task(self.task["name"], **self.task.get("options", {}))
        record = Path(self.checkpoint) / SFT_RECORD
        try:
            spec = json.loads(record.read_text())["task"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{record}: missing or malformed task record ({exc})") from exc
        options = dict(spec.get("options", {}))
        if spec["name"] == "addition":
            options["eval_size"] = eval_size
        return get_task(spec["name"], **options)


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
        eval_every=eval_every or t.eval_every,
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
    """Train the default warm start (``nibble run``'s: 3-digit addition, target 0.2) when missing."""
    if (Path(checkpoint) / "config.json").is_file():
        return
    spec = {"name": "addition", "options": {"digits": 3}}
    with get_task(spec["name"], **spec["options"]) as task:
        model, result = train_sft(task, target_accuracy=0.2, seed=seed)
    save_warm_start(model, result, spec, Path(checkpoint))
    print(f"warm start trained: {result.steps} steps, held-out accuracy {result.eval_accuracy:.3f}", flush=True)
