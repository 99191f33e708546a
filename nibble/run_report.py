"""``nibble run``'s outputs: ``summary.json`` and the reward/mismatch/staleness plots.

Everything is derived from what the services leave in the run directory: the trainer's
``metrics.jsonl`` (one line per step, plus a step-0 line with the warm start's evaluation) and each
sampler's ``samplers/<name>.json`` counters.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean

from nibble.config import RunConfig
from nibble.provenance import provenance


def read_lines(out: Path) -> list[dict]:
    """The trainer's per-step records (an empty list before the first step)."""
    path = Path(out) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_samplers(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((Path(out) / "samplers").glob("*.json"))]


def summarize(out: Path, config: RunConfig, wall_seconds: float) -> dict:
    """The run's summary (keys listed in the services issue) from the files in ``out``."""
    lines = read_lines(out)
    steps = [x for x in lines if x["step"] > 0]
    evals = [x["eval_accuracy"] for x in lines if x.get("eval_accuracy") is not None]
    last = steps[-1] if steps else {}
    sampler_tokens = sum(s["tokens"] for s in read_samplers(out))

    def mean(key: str) -> float | None:
        values = [x[key] for x in steps if x.get(key) is not None]
        return fmean(values) if values else None

    tail = steps[-5:]
    return {
        "steps": len(steps),
        "initial_reward": steps[0]["reward_mean"] if steps else None,
        "final_reward": fmean(x["reward_mean"] for x in tail) if tail else None,
        "eval_accuracy_before": evals[0] if evals else None,
        "eval_accuracy_after": evals[-1] if evals else None,
        "wall_seconds": wall_seconds,
        "sampler_tokens_per_second": sampler_tokens / wall_seconds if wall_seconds else 0.0,
        "trainer_tokens_per_second": sum(x["trained_tokens"] for x in steps) / wall_seconds if wall_seconds else 0.0,
        "mean_staleness": mean("staleness_mean"),
        "stale_dropped": last.get("stale_dropped_total", 0),
        "dead_lettered": last.get("dead_lettered_total", 0),
        "mismatch_kl_mean": mean("mismatch_kl"),
        "logprob_abs_diff_mean": mean("logprob_abs_diff"),
        "fresh_logprob_abs_diff_mean": mean("fresh_logprob_abs_diff"),
        "is_clipped_fraction_mean": mean("is_clipped_fraction"),
        "trainer_idle_seconds": sum(x["idle_seconds"] for x in steps),
        "weight_versions_published": last.get("policy_version", 0),
        "precision": config.plan.format,
        "four_over_six": config.plan.four_over_six is not None,
        "config": config.model_dump(mode="json"),
        "provenance": provenance(config),
    }


def plot(out: Path) -> list[Path]:
    """``reward.png``, ``mismatch.png`` and ``staleness.png`` in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [x for x in read_lines(out) if x["step"] > 0]
    evals = [(x["step"], x["eval_accuracy"]) for x in read_lines(out) if x.get("eval_accuracy") is not None]
    steps = [x["step"] for x in lines]
    figures = {
        "reward.png": [("reward_mean", "batch reward"), ("__eval__", "held-out accuracy")],
        "mismatch.png": [
            ("logprob_abs_diff", "mean |π_old − μ|"),
            ("fresh_logprob_abs_diff", "… staleness 0 only"),
            ("mismatch_kl", "k3 KL(sampler ‖ trainer)"),
        ],
        "staleness.png": [("staleness_mean", "mean staleness of the batch (versions)")],
    }
    written = []
    for name, series in figures.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, label in series:
            if key == "__eval__":
                if evals:
                    ax.plot(*zip(*evals, strict=True), "o-", label=label)
                continue
            ax.plot(steps, [x.get(key) for x in lines], label=label)
        ax.set_xlabel("trainer step")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(Path(out) / name, dpi=110)
        plt.close(fig)
        written.append(Path(out) / name)
    return written
