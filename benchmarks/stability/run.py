"""One stability run, and the grid of them.

Each run starts from the same model and runs Nibble's own code paths in one process: the sampler's
``rollout`` step (its ``BuiltinEngine``, a packed sampler-form model, generates, the task scores,
``build_group`` turns samples into wire groups), the trainer's ``assemble`` and ``train_on_batch``
(π_old, GRPO advantages, the corrected clipped loss, AdamW) train, and every new version travels as
weight-sync would send it (``published_state`` → ``quantize_state`` on the run's device → ``update_weights``;
before 2026-12-02 the quantise ran on the CPU, see :data:`PUBLISH_QUANTIZE`). Staleness is
simulated: the last ``max_staleness + 1`` published versions are kept, and each generation batch of
``groups_per_batch`` groups is sampled with a version ``lag`` steps old, ``lag`` drawn uniformly from
``0..min(max_staleness, v)`` by a seeded generator (the same lags for every variant of a seed), so both
the all-token and the staleness-0 mismatch are measured. Each step also records the wall-clock seconds
of its phases (:data:`STEP_SECONDS`), which ``nibble simulate --calibrate`` reads as step times.
"""

from __future__ import annotations

import copy
import multiprocessing
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

from benchmarks.stability.setting import Setting, Source
from benchmarks.stability.variants import plan_for
from nibble.model import from_pretrained, load_config
from nibble.recipe import PrecisionPlan, param_groups
from nibble.recipe.export import published_state, quantize_state
from nibble.sampler.engine import BuiltinEngine
from nibble.sampler.rollout import Sampling, rollout
from nibble.tasks import Task
from nibble.tasks.evaluation import accuracy
from nibble.trainer.batch import assemble
from nibble.trainer.step import train_on_batch

# Wall-clock seconds of each phase of a step, recorded with every step: generating the step's batches
# (weight swaps to older versions included), ``assemble`` + ``train_on_batch``, publishing and quantising
# the new version, and the held-out evaluation (null on steps without one).
STEP_SECONDS = ("generate_seconds", "train_seconds", "publish_seconds", "eval_seconds")

# Where weight-sync's quantise of a publication runs, recorded with each part (``machine.publish_quantize``):
# ``publish_seconds`` depend on it. Parts without the field quantised on the CPU.
PUBLISH_QUANTIZE = "on the run's device"


class VersionedSampler:
    """The sampler side: a packed engine plus weight-sync's form of the last ``keep`` versions."""

    def __init__(self, trainer_model, plan: PrecisionPlan, pad_id: int, keep: int, batch_rows: int):
        self.plan = plan
        # batch_rows: on CUDA the sampler service's CUDA-graph decoder (the CPU ignores it), as in production
        self.engine = BuiltinEngine(
            copy.deepcopy(trainer_model).pack(), pad_id=pad_id, policy_version=0, batch_rows=batch_rows
        )
        self.states: deque[tuple[int, dict]] = deque(maxlen=keep)
        self.publish(0, trainer_model)

    def publish(self, version: int, trainer_model) -> None:
        """What the trainer publishes (bf16 on the CPU) and weight-sync quantises once on the sampler's device
        (docs/design.md §5; the quantisers give the same bits on every device)."""
        published = {name: tensor.to(self.engine.device) for name, tensor in published_state(trainer_model).items()}
        self.states.append((version, quantize_state(published, self.plan)))

    def use(self, version: int) -> None:
        """Swap the engine to ``version`` between generation batches (pause → update → resume)."""
        if self.engine.policy_version == version:
            return
        state = next(s for v, s in self.states if v == version)
        self.engine.pause()
        try:
            self.engine.update_weights(version, state)
        finally:
            self.engine.resume()


def generate_groups(sampler: VersionedSampler, task: Task, examples, version: int, setting: Setting, seed: int):
    """Sample and score one generation batch with ``version`` (the sampler's own rollout step); wire
    groups of ≥ 2 responses."""
    sampler.use(version)
    sampling = Sampling(setting.group_size, setting.max_new_tokens, setting.temperature, top_p=1.0)

    def naming(example, responses: int) -> tuple[list[str], str]:
        return [f"{example.id}/{seed}/{i}" for i in range(responses)], f"{example.id}/{seed}"

    started = time.time()
    scored = rollout(
        sampler.engine, task, examples, sampling, seed=seed, sampler_id="stability", naming=naming, started_at=started
    )
    return [s.group for s in scored if s.group is not None]


def evaluate(model, task: Task) -> float:
    model.eval()
    try:
        return accuracy(model, task)
    finally:
        model.train()


def run_one(source: Source | Path, variant: str, seed: int, setting: Setting, device: str = "cpu") -> dict:
    """One run of ``variant`` with ``seed`` on ``device``: per-step records and the start's accuracy.

    Raises:
        ValueError: an unknown ``variant``, or a warm start without its task record.
    """
    source = source if isinstance(source, Source) else Source(Path(source))
    torch.set_num_threads(1 if torch.device(device).type == "cpu" else 4)
    torch.manual_seed(seed)
    started = time.time()
    plan = plan_for(variant, load_config(source.checkpoint).num_hidden_layers, source.quantize, device)
    config = setting.trainer_config()
    with source.make_task(setting.eval_size) as task:
        model = from_pretrained(source.checkpoint, plan=plan).to(device).train()
        optimizer = torch.optim.AdamW(param_groups(model, plan, config.weight_decay), lr=config.learning_rate)
        sampler = VersionedSampler(
            model,
            plan,
            task.tokenizer.pad_id,
            keep=setting.max_staleness + 1,
            batch_rows=setting.groups_per_batch * setting.group_size,
        )
        lags = random.Random(f"stability/lags/{seed}")
        stream = task.train_stream(seed)
        warm = evaluate(model, task)
        records = []
        for step in range(1, setting.steps + 1):
            version = step - 1  # the trainer publishes once per step
            groups, clock = [], _Clock(device)
            for b in range(setting.groups_per_step // setting.groups_per_batch):
                lag = lags.randint(0, min(setting.max_staleness, version))
                examples = [next(stream) for _ in range(setting.groups_per_batch)]
                batch_seed = seed * 100_003 + step * 101 + b
                groups += generate_groups(sampler, task, examples, version - lag, setting, batch_seed)
            seconds = {"generate_seconds": clock.lap()}
            batch = assemble(groups, version)
            result = train_on_batch(model, optimizer, batch, config)
            seconds["train_seconds"] = clock.lap()
            sampler.publish(version + 1, model)
            seconds["publish_seconds"] = clock.lap()
            evaluated = step % setting.eval_every == 0 or step == setting.steps
            accuracy_now = evaluate(model, task) if evaluated else None
            seconds["eval_seconds"] = clock.lap() if evaluated else None
            records.append(_record(step, batch, result, accuracy_now) | seconds)
            if evaluated:  # a 150-step run takes minutes: say how far it is at every evaluation
                print(
                    f"  {variant} seed {seed} {device}: step {step}/{setting.steps}, {time.time() - started:.0f}s, "
                    f"held-out accuracy {accuracy_now:.3f}",
                    flush=True,
                )
    return {
        "variant": variant,
        "seed": seed,
        "device": device,
        "warm_start_accuracy": warm,
        "wall_seconds": time.time() - started,
        "steps": records,
    }


class _Clock:
    """Wall-clock seconds between laps; on CUDA each lap first waits for the device's queued work, so a
    phase is charged for its own kernels, not the next phase's."""

    def __init__(self, device: str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.device = device
        self.last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        seconds, self.last = now - self.last, now
        return seconds


def _record(step: int, batch, result, eval_accuracy: float | None) -> dict:
    """One step's numbers (means over the batch's valid tokens unless named otherwise). The caller adds
    the step's wall-clock seconds (:data:`STEP_SECONDS`)."""
    lengths = batch.mask.sum(dim=1).float()
    fresh = result.fresh or {}
    return {
        "step": step,
        "grad_norm": result.grad_norm,
        "reward": float(batch.rewards.mean()),
        "eval_accuracy": eval_accuracy,
        "logprob_abs_diff": result.stats["logprob_abs_diff"],
        "mismatch_kl": result.stats["mismatch_kl"],
        "fresh_logprob_abs_diff": fresh.get("logprob_abs_diff"),
        "fresh_mismatch_kl": fresh.get("mismatch_kl"),
        "entropy": result.entropy,
        "skipped_updates": result.skipped_updates,
        "staleness_mean": float(batch.staleness.float().mean()),
        "response_tokens_mean": float(lengths.mean()),
        "truncated_fraction": float(batch.truncated.float().mean()),
        "is_clipped_fraction": result.stats["is_clipped_fraction"],
        "ppo_clip_fraction": result.stats["ppo_clip_fraction"],
        "loss": result.loss,
    }


def run_grid(
    source: Source | Path,
    variants: list[str],
    seeds: list[int],
    setting: Setting,
    *,
    workers: int = 1,
    skip: set[tuple[str, int]] = frozenset(),
    max_runs: int | None = None,
    on_run: Callable[[dict, int, int], None] | None = None,
) -> list[dict]:
    """Every ``variant × seed`` run not in ``skip`` (the first ``max_runs`` of them when given); seed-major,
    so a partial grid covers every variant.

    On the CPU, ``workers`` processes of one torch thread each (1: in this process); on GPUs, one process
    per device of ``source.devices``, each holding one device at a time. ``on_run(run, done, total)`` is
    called as each run finishes (progress, incremental saving). Runs come back in grid order.
    """
    source = source if isinstance(source, Source) else Source(Path(source))
    jobs = [(v, s) for s in seeds for v in variants if (v, s) not in skip][:max_runs]
    devices = list(source.devices) if source.devices != ("cpu",) else ["cpu"] * max(1, workers)
    runs: dict[tuple[str, int], dict] = {}
    if len(devices) == 1:
        for variant, seed in jobs:
            runs[variant, seed] = run_one(source, variant, seed, setting, devices[0])
            if on_run:
                on_run(runs[variant, seed], len(runs), len(jobs))
        return [runs[j] for j in jobs]
    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    with context.Manager() as manager, ProcessPoolExecutor(len(devices), mp_context=context) as pool:
        free = manager.Queue()
        for device in devices:
            free.put(device)
        futures = {pool.submit(run_on_free_device, free, source, v, s, setting): (v, s) for v, s in jobs}
        for future in as_completed(futures):
            runs[futures[future]] = future.result()
            if on_run:
                on_run(runs[futures[future]], len(runs), len(jobs))
    return [runs[j] for j in jobs]


def run_on_free_device(free, source: Source, variant: str, seed: int, setting: Setting) -> dict:
    """:func:`run_one` on a device taken from the queue ``free`` and given back after."""
    device = free.get()
    try:
        return run_one(source, variant, seed, setting, device)
    finally:
        free.put(device)
