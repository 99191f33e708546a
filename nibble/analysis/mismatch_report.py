"""Train/rollout mismatch per precision plan: sample with the sampler's form, score with the trainer's.

For each plan, the sampler (packed weights) samples responses and records ``μ``; the trainer scores
the same tokens either with the same quantised forward (the bit-exact contract: ``δ`` should be 0
up to BLAS ordering) or in plain BF16 (what a trainer without the recipe's quantised forward sees).
``δ = π_trainer − μ``; metrics follow docs/design.md §4: ``logprob_abs_diff = mean|δ|`` and the k3
estimate ``mismatch_kl = mean(exp(δ) − δ − 1)``.

The model and task come from a warm start (``nibble sft``'s record beside it) or from a run config
(:class:`Source`: its checkpoint, task and ``plan.quantize``), on the CPU or a CUDA device (where the plans
compute in bfloat16, as the services resolve ``compute_dtype: auto``, and the samplers decode with the
packed NVFP4 kernels).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nibble.config import devices
from nibble.model import MoETransformer, from_pretrained, load_config
from nibble.model.generate import generate
from nibble.model.scoring import score
from nibble.recipe import PrecisionPlan
from nibble.tasks import Task, get_task
from nibble.warmstart.sft import SFT_RECORD


@dataclass(frozen=True)
class MismatchRow:
    """One plan under one trainer arrangement; means over all sampled response tokens."""

    plan: str
    trainer: str  # "same_quantized_forward" | "plain_bf16"
    logprob_abs_diff: float
    mismatch_kl: float
    tokens: int


@dataclass(frozen=True)
class Source:
    """Where :func:`measure` takes its model and task from, and where it computes.

    Attributes:
        checkpoint: a model directory (``config.json`` and weights).
        task: ``{"name", "options"}`` as a run config gives it; ``None``: the task ``nibble sft`` recorded
            beside the checkpoint.
        quantize: the plans' ``quantize`` (``experts`` for MoEs, ``all_linear`` for dense models).
        device: ``cpu``, ``cuda`` or ``cuda:N``.
    """

    checkpoint: Path
    task: dict | None = None
    quantize: str = "experts"
    device: str = "cpu"


def source_of(checkpoint: Path | None, config: Path | None, device: str | None) -> Source:
    """The :class:`Source` of a warm start (``checkpoint``) or of a run config (``config``: its
    ``model.checkpoint``, task and ``plan.quantize``, and ``trainer.device`` unless ``device`` is given).

    Raises:
        ValueError: neither or both given, a config the loader refuses (naming the file and field), a
            checkpoint that is not a model directory, or a malformed ``device``.
    """
    if (checkpoint is None) == (config is None):
        raise ValueError("give one of --checkpoint (a warm start) and --config (a run config)")
    if config is not None:
        from nibble.config import load

        run = load(config)
        field = "--device" if device is not None else f"{config}: trainer.device"
        source = Source(
            Path(run.model.checkpoint),
            task={"name": run.task.name, "options": run.task.options},
            quantize=run.plan.quantize,
            device=device if device is not None else run.trainer.device,
        )
        where = f"{config}: model.checkpoint {source.checkpoint}"
    else:
        field = "--device"
        source = Source(Path(checkpoint), device=device if device is not None else "cpu")
        where = str(source.checkpoint)
    devices.resolve(field, source.device)  # refuses a malformed device or a GPU this process cannot see
    if not (source.checkpoint / "config.json").is_file():
        raise ValueError(f"{where}: not a model directory (no config.json)")
    return source


def plan_variants(
    num_layers: int, *, quantize: str = "experts", shared_experts: bool = True, compute_dtype: str = "float32"
) -> dict[str, PrecisionPlan]:
    """BF16, MXFP8, NVFP4 and NVFP4+4/6, each quantised one with/without last-15% and shared-expert BF16
    (a model without shared experts gets only ``shared_bf16=off``: the other would be the same plan)."""
    common = {"num_layers": num_layers, "quantize": quantize, "compute_dtype": compute_dtype}
    variants = {"bf16": PrecisionPlan(format="bf16", **common)}
    for name, fmt, four_over_six in (("mxfp8", "mxfp8", None), ("nvfp4", "nvfp4", None), ("nvfp4+4/6", "nvfp4", "mse")):
        for tail in (0.15, 0.0):
            for shared in (True, False) if shared_experts else (False,):
                label = f"{name} tail15={'on' if tail else 'off'} shared_bf16={'on' if shared else 'off'}"
                variants[label] = PrecisionPlan(
                    format=fmt,
                    four_over_six=four_over_six,
                    bf16_last_fraction=tail,
                    bf16_shared_experts=shared,
                    **common,
                )
    return variants


def task_of(checkpoint: Path) -> Task:
    """The task recorded by ``nibble sft`` beside the checkpoint.

    Raises:
        ValueError: naming the file when ``nibble_sft.json`` is missing or malformed.
    """
    record = Path(checkpoint) / SFT_RECORD
    if not record.is_file():
        raise ValueError(f"{record}: missing (the checkpoint must come from `nibble sft`)")
    try:
        spec = json.loads(record.read_text())["task"]
        return get_task(spec["name"], **spec.get("options", {}))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{record}: malformed task record ({exc})") from exc


def measure(
    source: Source | Path,
    *,
    prompts: int = 128,
    temperature: float = 1.0,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[MismatchRow]:
    """Rows for every plan of :func:`plan_variants` and both trainer arrangements; ``progress(done, total,
    plan)`` before the first plan and after each (sampling and both scorings). ``source``: a
    :class:`Source`, or a warm start's path (its recorded task, ``experts`` quantised, on the CPU).

    Raises:
        ValueError: a missing or malformed task record, a tokenizer that does not fit the model, or a
            device this machine lacks.
    """
    source = source if isinstance(source, Source) else Source(Path(source))
    checkpoint, device = Path(source.checkpoint), devices.resolve("device", source.device)
    config = load_config(checkpoint)
    compute_dtype = "bfloat16" if device.type == "cuda" else "float32"
    task = get_task(source.task["name"], **source.task.get("options", {})) if source.task else task_of(checkpoint)
    with task:
        if task.tokenizer.vocab_size != config.vocab_size:
            raise ValueError(
                f"{checkpoint}: the task's tokenizer has {task.tokenizer.vocab_size} tokens, the model "
                f"{config.vocab_size} (another model's tokenizer, or the task's data changed since `nibble sft`)"
            )
        examples = task.train_examples(prompts, seed=seed)
        prompt_ids = [task.prompt_ids(e) for e in examples]
        stops, pad = [task.tokenizer.eos_id], task.tokenizer.pad_id
        variants = plan_variants(
            config.num_hidden_layers,
            quantize=source.quantize,
            shared_experts=bool(config.shared_expert_intermediate_size),
            compute_dtype=compute_dtype,
        )
        bf16_trainer = from_pretrained(checkpoint, plan=variants["bf16"]).to(device).eval()
        rows = []
        if progress:
            progress(0, len(variants), "")
        for done, (label, plan) in enumerate(variants.items(), start=1):
            trainer = from_pretrained(checkpoint, plan=plan).to(device).eval()
            sampler = copy.deepcopy(trainer).pack()  # on CUDA with the fragment layout its kernels read
            out = generate(
                sampler,
                prompt_ids,
                max_new_tokens=task.max_response_tokens,
                temperature=temperature,
                stop_tokens=stops,
                pad_id=pad,
                generator=torch.Generator(device).manual_seed(seed),
            )
            mu = torch.cat([torch.tensor(lp, dtype=torch.float64) for lp in out.logprobs])
            for arrangement, scorer in (("same_quantized_forward", trainer), ("plain_bf16", bf16_trainer)):
                rows.append(_row(label, arrangement, scorer, prompt_ids, out.tokens, mu, temperature, pad))
            if progress:
                progress(done, len(variants), label)
    return rows


@torch.no_grad()
def _row(label, arrangement, scorer: MoETransformer, prompts, responses, mu, temperature, pad) -> MismatchRow:
    scores = score(scorer, prompts, responses, temperature=temperature, pad_id=pad)
    delta = scores.logprobs[scores.mask].double().cpu() - mu
    return MismatchRow(
        plan=label,
        trainer=arrangement,
        logprob_abs_diff=float(delta.abs().mean()),
        mismatch_kl=float((delta.exp() - delta - 1).mean()),
        tokens=int(delta.numel()),
    )


def as_json(rows: list[MismatchRow]) -> list[dict]:
    return [asdict(r) for r in rows]
