"""Stability evidence: the RL loop over a grid of precision variants × seeds, with per-step records.

Each run starts from the same SFT warm start and runs Nibble's own code paths in one process: the
sampler's ``rollout`` step (its ``BuiltinEngine``, a packed sampler-form model, generates, the task
scores, ``build_group`` turns samples into wire groups), the trainer's ``assemble`` and
``train_on_batch`` (π_old, GRPO advantages, the TIS-corrected clipped loss, AdamW) train, and every
new version travels as weight-sync would send it (``published_state`` → ``quantize_state`` →
``update_weights``). Staleness is simulated:
the last ``max_staleness + 1`` published versions are kept, and each generation batch of
``groups_per_batch`` groups is sampled with a version ``lag`` steps old, ``lag`` drawn uniformly from
``0..min(max_staleness, v)`` by a seeded generator (the same lags for every variant of a seed), so both
the all-token and the staleness-0 mismatch are measured.

Variants (docs/design.md §3; "the three" techniques are per-token activation scales, four-over-six and the
dequantised backward): ``bf16``; ``mxfp8`` (dequantised backward, the recipe's BF16 exceptions);
``nvfp4_naive`` (per-tensor activation scale, no 4/6, high-precision backward, no BF16 exceptions);
each single technique and each pair added to the naive one (still no BF16 exceptions, so each differs
from the naive variant only in the techniques it names); ``nvfp4_three`` (all three, no BF16
exceptions); ``recipe`` (all three plus the last 15% of layers and the shared experts in BF16).

    .venv/bin/python -m benchmarks.stability [--checkpoint runs/warm_start] [--seeds 0 1 2 3 4] [--steps 100]
        [--variants ...] [--workers 2] [--out benchmarks/results/stability.json]

Then ``nibble report stability benchmarks/results/stability.json --out docs/stability``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import shlex
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean

import torch

from nibble.analysis import stability_events
from nibble.config import TrainerConfig
from nibble.model import from_pretrained, load_config
from nibble.recipe import PrecisionPlan, param_groups
from nibble.recipe.export import published_state, quantize_state
from nibble.sampler.engine import BuiltinEngine
from nibble.sampler.rollout import Sampling, rollout
from nibble.tasks import Task, get_task
from nibble.tasks.evaluation import accuracy
from nibble.trainer.batch import assemble
from nibble.trainer.step import train_on_batch
from nibble.warmstart.sft import SFT_RECORD, save_warm_start, train_sft

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "stability.json"

_NAIVE = {
    "format": "nvfp4",
    "activation_scale": "per_tensor",
    "four_over_six": None,
    "backward": "high_precision",
    "bf16_last_fraction": 0.0,
    "bf16_shared_experts": False,
}
_TECHNIQUES = {
    "token": {"activation_scale": "per_token"},
    "4o6": {"four_over_six": "mse"},
    "deq": {"backward": "dequantized"},
}
_BF16_EXCEPTIONS = {"bf16_last_fraction": 0.15, "bf16_shared_experts": True}


def _nvfp4(*techniques: str, bf16_exceptions: bool = False) -> dict:
    knobs = dict(_NAIVE)
    for name in techniques:
        knobs.update(_TECHNIQUES[name])
    return {**knobs, **(_BF16_EXCEPTIONS if bf16_exceptions else {})}


# Plan knobs (``PrecisionPlan`` fields besides ``num_layers``) of every variant, in table order.
VARIANTS: dict[str, dict] = {
    "bf16": {"format": "bf16"},
    "mxfp8": {"format": "mxfp8", "backward": "dequantized", **_BF16_EXCEPTIONS},
    "nvfp4_naive": _nvfp4(),
    "nvfp4_token": _nvfp4("token"),
    "nvfp4_4o6": _nvfp4("4o6"),
    "nvfp4_deq": _nvfp4("deq"),
    "nvfp4_token_4o6": _nvfp4("token", "4o6"),
    "nvfp4_token_deq": _nvfp4("token", "deq"),
    "nvfp4_4o6_deq": _nvfp4("4o6", "deq"),
    "nvfp4_three": _nvfp4("token", "4o6", "deq"),
    "recipe": _nvfp4("token", "4o6", "deq", bf16_exceptions=True),
}


@dataclass(frozen=True)
class Setting:
    """The RL setting, made harder than configs/default.yaml so instability has room to appear.

    Attributes:
        steps: trainer steps per run. groups_per_step / group_size: GRPO groups per step and responses
            per group. groups_per_batch: groups generated together with one policy version.
        max_new_tokens: response budget (the 3-digit task needs 5: 4 digits and EOS; a longer budget lets
            a degrading policy ramble). learning_rate: AdamW (default config: 2e-4).
        max_staleness: oldest version a batch may be sampled with (default config: 2).
        eval_every: steps between held-out evaluations (greedy, the trainer's quantised forward).
        eval_size: held-out problems per evaluation (a prefix of the task's fixed evaluation split).
        temperature: sampling and scoring temperature.
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

    def trainer_config(self) -> TrainerConfig:
        return TrainerConfig(
            total_steps=self.steps,
            groups_per_step=self.groups_per_step,
            learning_rate=self.learning_rate,
            max_staleness=self.max_staleness,
            eval_every=self.eval_every,
        )


def task_for(checkpoint: Path, eval_size: int) -> Task:
    """The task recorded beside the warm start, with ``eval_size`` held-out problems.

    Raises:
        ValueError: naming the file when ``nibble_sft.json`` is missing or malformed.
    """
    record = Path(checkpoint) / SFT_RECORD
    try:
        spec = json.loads(record.read_text())["task"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{record}: missing or malformed task record ({exc})") from exc
    options = dict(spec.get("options", {}))
    if spec["name"] == "addition":
        options["eval_size"] = eval_size
    return get_task(spec["name"], **options)


def ensure_warm_start(checkpoint: Path, seed: int = 0) -> None:
    """Train the default warm start (``nibble run``'s: 3-digit addition, target 0.2) when missing."""
    if (Path(checkpoint) / "config.json").is_file():
        return
    spec = {"name": "addition", "options": {"digits": 3}}
    with get_task(spec["name"], **spec["options"]) as task:
        model, result = train_sft(task, target_accuracy=0.2, seed=seed)
    save_warm_start(model, result, spec, Path(checkpoint))
    print(f"warm start trained: {result.steps} steps, held-out accuracy {result.eval_accuracy:.3f}", flush=True)


class VersionedSampler:
    """The sampler side: a packed engine plus weight-sync's form of the last ``keep`` versions."""

    def __init__(self, trainer_model, plan: PrecisionPlan, pad_id: int, keep: int):
        self.plan = plan
        self.engine = BuiltinEngine(copy.deepcopy(trainer_model).pack(), pad_id=pad_id, policy_version=0)
        self.states: deque[tuple[int, dict]] = deque(maxlen=keep)
        self.publish(0, trainer_model)

    def publish(self, version: int, trainer_model) -> None:
        """What the trainer publishes and weight-sync quantises once (docs/design.md §5)."""
        self.states.append((version, quantize_state(published_state(trainer_model), self.plan)))

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


def run_one(checkpoint: Path, variant: str, seed: int, setting: Setting, threads: int = 1) -> dict:
    """One run of ``variant`` with ``seed``: per-step records and the warm start's accuracy.

    Raises:
        ValueError: an unknown ``variant``, or a checkpoint without its task record.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {sorted(VARIANTS)}")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    started = time.time()
    plan = PrecisionPlan(num_layers=load_config(checkpoint).num_hidden_layers, **VARIANTS[variant])
    config = setting.trainer_config()
    with task_for(checkpoint, setting.eval_size) as task:
        model = from_pretrained(checkpoint, plan=plan).train()
        optimizer = torch.optim.AdamW(param_groups(model, plan, config.weight_decay), lr=config.learning_rate)
        sampler = VersionedSampler(model, plan, task.tokenizer.pad_id, keep=setting.max_staleness + 1)
        lags = random.Random(f"stability/lags/{seed}")
        stream = task.train_stream(seed)
        warm = evaluate(model, task)
        records = []
        for step in range(1, setting.steps + 1):
            version = step - 1  # the trainer publishes once per step
            groups = []
            for b in range(setting.groups_per_step // setting.groups_per_batch):
                lag = lags.randint(0, min(setting.max_staleness, version))
                examples = [next(stream) for _ in range(setting.groups_per_batch)]
                batch_seed = seed * 100_003 + step * 101 + b
                groups += generate_groups(sampler, task, examples, version - lag, setting, batch_seed)
            batch = assemble(groups, version)
            result = train_on_batch(model, optimizer, batch, config)
            sampler.publish(version + 1, model)
            evaluated = step % setting.eval_every == 0 or step == setting.steps
            records.append(_record(step, batch, result, evaluate(model, task) if evaluated else None))
    return {
        "variant": variant,
        "seed": seed,
        "warm_start_accuracy": warm,
        "wall_seconds": time.time() - started,
        "steps": records,
    }


def _record(step: int, batch, result, eval_accuracy: float | None) -> dict:
    """One step's numbers (means over the batch's valid tokens unless named otherwise)."""
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
    checkpoint: Path,
    variants: list[str],
    seeds: list[int],
    setting: Setting,
    *,
    workers: int = 1,
    on_run=None,
) -> list[dict]:
    """Every ``variant × seed`` run (``workers`` processes of one torch thread each; 1 = in this process).

    ``on_run(run, done, total)`` is called as each run finishes (progress, incremental saving).
    Runs come back in grid order whatever order they finished in.
    """
    jobs = [(v, s) for s in seeds for v in variants]  # seed-major: a partial grid covers every variant
    runs: dict[tuple[str, int], dict] = {}
    if workers <= 1:
        for variant, seed in jobs:
            runs[variant, seed] = run_one(checkpoint, variant, seed, setting)
            if on_run:
                on_run(runs[variant, seed], len(runs), len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(run_one, checkpoint, v, s, setting): (v, s) for v, s in jobs}
            for future in as_completed(futures):
                runs[futures[future]] = future.result()
                if on_run:
                    on_run(runs[futures[future]], len(runs), len(jobs))
    return [runs[j] for j in jobs if j in runs]


def results_document(runs: list[dict], setting: Setting, checkpoint: Path, command: str, wall_seconds: float) -> dict:
    """The JSON that ``nibble report stability`` reads (the machine is recorded by the caller)."""
    return {
        "benchmark": "stability",
        "command": command,
        "checkpoint": _relative(checkpoint),
        "setting": asdict(setting),
        "definitions": {
            "spike": f"grad norm > {stability_events.SPIKE_FACTOR}x the median of the previous "
            f"{stability_events.SPIKE_WINDOW} steps' finite norms (judged with >= "
            f"{stability_events.SPIKE_MIN_HISTORY} of them); a non-finite norm is a spike",
            "collapse": f"held-out accuracy < warm start - {stability_events.COLLAPSE_DROP} at an evaluation, "
            f"with no evaluation back at or above it within {stability_events.COLLAPSE_PATIENCE} steps",
        },
        "variants": {name: VARIANTS[name] for name in dict.fromkeys(r["variant"] for r in runs)},
        "wall_seconds": wall_seconds,
        "runs": runs,
    }


def _relative(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (the JSON is committed)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.machine import describe

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "runs" / "warm_start")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=Setting.steps)
    parser.add_argument("--eval-every", type=int, default=Setting.eval_every)
    parser.add_argument("--workers", type=int, default=1, help="processes (one torch thread each)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    command = shlex.join([".venv/bin/python", "-m", "benchmarks.stability", *(sys.argv[1:] if argv is None else argv)])
    setting = Setting(steps=args.steps, eval_every=args.eval_every)
    ensure_warm_start(args.checkpoint)
    started = time.time()
    machine = describe()
    machine["workers"] = args.workers
    machine["torch_threads_per_run"] = 1  # run_one's default; describe() reports the parent's threads
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done: list[dict] = []

    def progress(run: dict, finished: int, total: int) -> None:
        done.append(run)
        norms = [s["grad_norm"] for s in run["steps"]]
        accs = [s["eval_accuracy"] for s in run["steps"] if s["eval_accuracy"] is not None]
        print(
            f"[{finished}/{total}] {time.time() - started:7.0f}s {run['variant']:16s} seed {run['seed']} "
            f"{run['wall_seconds']:5.0f}s spikes {len(stability_events.spike_steps(norms))} "
            f"acc {run['warm_start_accuracy']:.3f}->{accs[-1]:.3f} "
            f"reward(last10) {fmean(s['reward'] for s in run['steps'][-10:]):.3f}",
            flush=True,
        )
        _save(args.out, done, setting, args.checkpoint, command, time.time() - started, machine)  # partial grid

    runs = run_grid(args.checkpoint, args.variants, args.seeds, setting, workers=args.workers, on_run=progress)
    _save(args.out, runs, setting, args.checkpoint, command, time.time() - started, machine)
    print(f"recorded {len(runs)} runs in {args.out} ({time.time() - started:.0f} s)")


def dumps(document: dict) -> str:
    """The results as JSON text: indented, with one line per step record (diffable line by line)."""
    text = json.dumps({**document, "runs": []}, indent=1)
    runs = []
    for run in document["runs"]:
        head = json.dumps({k: v for k, v in run.items() if k != "steps"})[:-1]
        steps = ",\n".join("   " + json.dumps(step) for step in run["steps"])
        runs.append(f'  {head}, "steps": [\n{steps}\n  ]}}')
    return text.replace('"runs": []', '"runs": [\n' + ",\n".join(runs) + "\n ]") + "\n"


def _save(out: Path, runs, setting, checkpoint, command, wall_seconds, machine) -> None:
    document = results_document(runs, setting, checkpoint, command, wall_seconds)
    document["machine"] = machine
    tmp = out.with_suffix(".tmp")
    tmp.write_text(dumps(document))
    tmp.replace(out)


if __name__ == "__main__":
    main()
