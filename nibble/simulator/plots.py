"""The simulator's figure (matplotlib, PNG): drift, batch mismatch, reward with ghosts, and the timeline.

matplotlib is imported inside :func:`write_png`, so importing the simulator stays cheap.
"""

from __future__ import annotations

from pathlib import Path

from nibble.simulator import drift_model
from nibble.simulator.dynamics import rollout_cost
from nibble.simulator.simulate import SimResult

# Colours shared with the page (web/page.js): one per precision, a colour map for mismatch.
PRECISION_COLOURS = {"bf16": "#1f77b4", "mxfp8": "#2ca02c", "nvfp4": "#d62728"}
MISMATCH_CMAP = "viridis"
# The timeline panel shows the first train steps only, so bars stay readable.
TIMELINE_STEPS = 12


def write_png(result: SimResult, path: Path) -> Path:
    """Write the 2×2 figure of ``result`` to ``path`` (150 dpi) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), constrained_layout=True)
    _drift(axes[0, 0], result)
    _mismatch(axes[0, 1], result)
    _reward(axes[1, 0], result)
    _timeline(fig, axes[1, 1], result)
    config = result.run.config
    summary = result.summary()
    fig.suptitle(
        f"{_label(config)} · staleness ≤ {config.max_staleness} · batch {config.batch} · {config.horizon} horizon · "
        f"{config.num_samplers} samplers — {summary['verdict']}, {summary['speed_vs_sync_bf16']:.2f}× sync BF16"
    )
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _label(config) -> str:
    if config.precision == "bf16":
        return "BF16"
    parts = [config.precision.upper()]
    if config.precision == "nvfp4" and config.four_over_six:
        parts.append("4/6")
    parts.append("deq. backward" if config.dequantized_backward else "hp backward")
    if config.bf16_last_15:
        parts.append("last 15% BF16")
    if config.bf16_shared_experts:
        parts.append("shared BF16")
    return " + ".join(parts)


def _steps(n: int) -> list[int]:
    return list(range(1, n + 1))


def _drift(ax, result: SimResult) -> None:
    for precision, ghost in result.ghosts.items():
        ax.plot(_steps(len(ghost.dynamics.drift)), ghost.dynamics.drift, color=PRECISION_COLOURS[precision],
                alpha=0.25, lw=1, label=f"{precision} (ghost)")  # fmt: skip
    dyn = result.run.dynamics
    ax.plot(_steps(len(dyn.drift)), dyn.drift, color=PRECISION_COLOURS[result.run.config.precision], lw=1.8,
            label=result.run.config.precision)  # fmt: skip
    ax.axhline(drift_model.COLLAPSE_DRIFT, color="k", ls="--", lw=1, label="collapse (2.2)")
    for k in dyn.spikes:
        ax.axvline(k + 1, color="orange", alpha=0.3, lw=0.8)
    if dyn.collapsed_at is not None:
        ax.axvline(dyn.collapsed_at + 1, color="k", lw=1.2)
    ax.set_ylim(0, max(3.0, min(max(dyn.drift) * 1.05, 10.5)))
    ax.set(title="policy drift (orange: gradient spikes)", xlabel="train step", ylabel="drift")
    ax.legend(fontsize=8, loc="upper left")


def _mismatch(ax, result: SimResult) -> None:
    dyn = result.run.dynamics
    ax.plot(_steps(len(dyn.mismatch)), dyn.mismatch, color=PRECISION_COLOURS[result.run.config.precision], lw=1.2,
            label="batch mismatch m")  # fmt: skip
    ax.axhline(drift_model.critical_mismatch(), color="k", ls="--", lw=1, label="critical m_c")
    ax.axhline(drift_model.FLOOR_WEIGHT * result.run.floor, color="grey", ls=":", lw=1, label="0.5 · floor")
    top = max(drift_model.critical_mismatch() * 1.6, min(max(dyn.mismatch) * 1.05, 0.3))
    ax.set_ylim(0, top)
    ax.set(title="batch mismatch (staleness cost + 0.5 · floor)", xlabel="train step", ylabel="nats / token")
    ax.legend(fontsize=8, loc="upper left")


def _reward(ax, result: SimResult) -> None:
    runs = dict(result.ghosts) | {result.run.config.precision: result.run}
    for precision, run in runs.items():
        main = run is result.run
        hours = [s.end / 3600 for s in run.timeline.steps]
        ax.plot(hours, run.dynamics.reward, color=PRECISION_COLOURS[precision], lw=1.8 if main else 1,
                alpha=1 if main else 0.35, label=precision + ("" if main else " (ghost)"))  # fmt: skip
    ax.set_ylim(0, 1)
    ax.set(title="reward vs wall-clock", xlabel="hours", ylabel="reward")
    ax.legend(fontsize=8, loc="lower right")


def _timeline(fig, ax, result: SimResult) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    run, timeline = result.run, result.run.timeline
    steps = timeline.steps[:TIMELINE_STEPS]
    horizon_end = steps[-1].end
    cmap, norm = plt.get_cmap(MISMATCH_CMAP), Normalize(0, drift_model.critical_mismatch() * 1.5)
    floor_part = drift_model.FLOOR_WEIGHT * run.floor
    n = run.config.num_samplers
    for r in timeline.rollouts:
        if r.start >= horizon_end:
            break
        end = horizon_end if r.end is None else min(r.end, horizon_end)
        if r.discarded:
            ax.barh(r.sampler, end - r.start, left=r.start, color="lightgrey", hatch="///", edgecolor="grey", lw=0)
        else:
            gap = r.step if r.step is not None else len(timeline.steps)
            mismatch = floor_part + rollout_cost(r, gap)
            ax.barh(r.sampler, end - r.start, left=r.start, color=cmap(norm(mismatch)), edgecolor="white", lw=0.3)
    for p in timeline.pauses:
        if p.start < horizon_end:
            ax.barh(p.sampler, p.end - p.start, left=p.start, color="black", height=0.3)
    costs = [run.dynamics.mismatch[s.index] for s in steps]
    for s, m in zip(steps, costs, strict=True):
        ax.barh(n + 0.5, s.end - s.start, left=s.start, color=cmap(norm(m)), edgecolor="white", height=1.2)
    ax.set_yticks([*range(n), n + 0.5], [f"sampler {i}" for i in range(n)] + ["trainer"], fontsize=7)
    ax.set_xlim(0, horizon_end)
    ax.set(title=f"timeline, first {len(steps)} steps (hatched: discarded; black: weight sync)", xlabel="seconds")
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="mismatch (nats/token)")
