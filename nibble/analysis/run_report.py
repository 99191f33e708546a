"""``nibble run``'s outputs: ``summary.json`` and the reward/mismatch/staleness plots.

Everything is derived from what the services leave in the run directory: the trainer's
``metrics.jsonl`` (one line per step, plus a step-0 line with the warm start's evaluation) and the run's
segments (``run.json``: wall-clock and sampler counters of every launch).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from statistics import fmean

from nibble.config import RunConfig
from nibble.rundir import Segment
from nibble.rundir.provenance import provenance


def read_lines(out: Path) -> list[dict]:
    """The trainer's per-step records in step order (an empty list before the first step).

    A step recorded twice keeps its last record: a trainer stopped after recording a step but before its
    checkpoint redoes that step when resumed, and only the redone one counts. A line cut short by a
    killed trainer is skipped.
    """
    path = Path(out) / "metrics.jsonl"
    if not path.is_file():
        return []
    by_step = {}
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
            by_step[int(line["step"])] = line
        except (ValueError, KeyError, TypeError):
            continue
    return [by_step[step] for step in sorted(by_step)]


def summarize(out: Path, config: RunConfig, segments: list[Segment]) -> dict:
    """The run's summary from the files in ``out`` and its ``segments`` (every launch that worked on it).

    Wall-clock and throughputs cover all segments: ``wall_seconds`` is the sum of the segments' running
    time (``elapsed_seconds`` adds the pauses between them); ``status`` is the last segment's.
    """
    wall_seconds = sum(s.wall_seconds for s in segments)
    lines = read_lines(out)
    steps = [x for x in lines if x["step"] > 0]
    evals = [x["eval_accuracy"] for x in lines if x.get("eval_accuracy") is not None]
    last = steps[-1] if steps else {}
    sampler_tokens = sum(s.sampler_tokens for s in segments)

    def mean(key: str) -> float | None:
        values = [x[key] for x in steps if x.get(key) is not None]
        return fmean(values) if values else None

    tail = steps[-5:]
    return {
        "status": segments[-1].status if segments else "running",
        "steps": len(steps),
        "total_steps": config.trainer.total_steps,
        "initial_reward": steps[0]["reward_mean"] if steps else None,
        "final_reward": fmean(x["reward_mean"] for x in tail) if tail else None,
        "eval_accuracy_before": evals[0] if evals else None,
        "eval_accuracy_after": evals[-1] if evals else None,
        "wall_seconds": wall_seconds,
        "elapsed_seconds": (segments[-1].ended_at or segments[-1].started_at) - segments[0].started_at
        if segments
        else 0.0,
        "warm_start_seconds": sum(s.warm_start_seconds for s in segments),
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
        "segments": [asdict(s) for s in segments],
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


def describe(summary: dict) -> list[str]:
    """A few lines a person reads at the end of ``nibble run`` (the numbers of :func:`summarize`)."""
    done = f"{summary['steps']}/{summary['total_steps']} steps"
    segments = len(summary["segments"])
    over = f" over {segments} segments" if segments > 1 else ""
    verb = {"finished": "finished", "stopped": "stopped at"}.get(summary["status"], f"{summary['status']} at")
    lines = [f"{verb} {done} in {duration(summary['wall_seconds'])}{over}"]
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    if before is not None and after is not None:
        lines.append(f"held-out accuracy  {before:.3f} → {after:.3f} ({after - before:+.3f})")
    if summary["initial_reward"] is not None:
        lines.append(
            f"batch reward       {summary['initial_reward']:.3f} (step 1) → "
            f"{summary['final_reward']:.3f} (last 5 steps)"
        )
    if summary["mean_staleness"] is not None:
        lines.append(
            f"staleness          mean {summary['mean_staleness']:.2f} versions; {summary['stale_dropped']} responses "
            f"dropped as stale, {summary['dead_lettered']} entries dead-lettered"
        )
    if summary["logprob_abs_diff_mean"] is not None:
        lines.append(f"mismatch           mean |π_old − μ| {summary['logprob_abs_diff_mean']:.4f}")
    lines.append(
        f"tokens/s           {summary['sampler_tokens_per_second']:.0f} sampled, "
        f"{summary['trainer_tokens_per_second']:.0f} trained"
    )
    return lines


def duration(seconds: float) -> str:
    """``42.0 s``, ``7m05s`` or ``1h02m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"
