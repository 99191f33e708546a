"""One simulated run: the timeline, the dynamics on it, the synchronous-BF16 baseline and ghost runs."""

from __future__ import annotations

from dataclasses import dataclass

from nibble.simulator import drift_model
from nibble.simulator.calibrate import DEFAULT_SOURCES, Calibration, published
from nibble.simulator.config import SimConfig
from nibble.simulator.dynamics import Dynamics, run_dynamics, step_costs
from nibble.simulator.timeline import Timeline, build_timeline


@dataclass(frozen=True)
class Run:
    """A timeline and the dynamics on it, for one configuration."""

    config: SimConfig
    timeline: Timeline
    dynamics: Dynamics
    floor: float  # precision floor f, nats/token

    @property
    def mean_staleness(self) -> float:
        consumed = [r.staleness for r in self.timeline.rollouts if r.step is not None and not r.discarded]
        return sum(consumed) / len(consumed)


@dataclass(frozen=True)
class SimResult:
    """The run asked for, its synchronous-BF16 baseline and ghost runs at the other precisions."""

    run: Run
    baseline_seconds: float  # wall-clock of the same steps, synchronous BF16
    calibration: Calibration
    ghosts: dict[str, Run]

    def summary(self) -> dict:
        """The headline numbers (units: seconds, nats/token; speed is a ratio of wall-clock times; steps
        count from 1)."""
        run, timeline, dyn = self.run, self.run.timeline, self.run.dynamics
        critical = drift_model.critical_mismatch()
        return {
            "steps": len(timeline.steps),
            "wall_clock_seconds": timeline.end_time,
            "sync_bf16_wall_clock_seconds": self.baseline_seconds,
            "speed_vs_sync_bf16": self.baseline_seconds / timeline.end_time,
            "trainer_utilisation": timeline.trainer_utilisation,
            "discards": timeline.discards,
            "mean_staleness": run.mean_staleness,
            "grad_spikes": len(dyn.spikes),
            "final_drift": dyn.drift[-1],
            "final_reward": dyn.reward[-1],
            "verdict": dyn.verdict,
            "collapsed_at_step": None if dyn.collapsed_at is None else dyn.collapsed_at + 1,  # 1-based
            "critical_mismatch": critical,
            "precision_floor": run.floor,
            "steady_mismatch": dyn.steady_mismatch,
            "drift_headroom": critical - dyn.steady_mismatch,
        }


def step_seconds(config: SimConfig, calibration: Calibration) -> tuple[float, float, float]:
    """``(rollout, train, weight sync)`` seconds for ``config`` under ``calibration``: each of its own format
    (and backward, for the train time)."""
    rollout, train, sync = (calibration.seconds(name) for name in step_names(config))
    return rollout, train, sync


def step_names(config: SimConfig) -> tuple[str, str, str]:
    """Names (as in ``Calibration.sources``) of the rollout, train and weight-sync seconds ``config`` runs on."""
    fmt = drift_model.format_key(config.precision, config.four_over_six)
    train = drift_model.train_key(config.precision, config.dequantized_backward)
    return f"rollout.{fmt}", f"train.{train}", f"weight_sync.{fmt}"


def sync_bf16_seconds(config: SimConfig, calibration: Calibration) -> float:
    """Wall-clock seconds of ``config``'s steps run as synchronous BF16, on BF16's own step times and pause."""
    baseline = sync_bf16(config)
    return build_timeline(baseline, *step_seconds(baseline, calibration)).end_time


def mixed_step_times(config: SimConfig, calibration: Calibration) -> list[str]:
    """The step times behind ``config``'s ``speed_vs_sync_bf16`` when some are published (or the illustrative
    pause) and some measured: its rollout, train and weight-sync seconds and the synchronous BF16 baseline's,
    each as ``"name (source)"``; empty when all are defaults or all measured.

    A calibration file replaces only the keys it measured (a grid of ``bf16`` and ``nvfp4_naive`` gives no
    four-over-six rollout time or pause), so a run may set a measured time beside a published one: a 135 M
    model's sub-second H200 step against the article's 30 B model's minutes. Their ratio is no speed-up.
    """
    return mixed_sources(calibration, (*step_names(config), *step_names(sync_bf16(config))))


def mixed_sources(calibration: Calibration, names) -> list[str]:
    """``names`` (keys of ``calibration.sources``) as ``"name (source)"`` when some are defaults (published,
    illustrative) and some measured; empty otherwise. ``--optimize`` passes every step time, as it compares
    every plan."""
    names = tuple(dict.fromkeys(names))
    if len({calibration.sources[n] in DEFAULT_SOURCES for n in names}) <= 1:
        return []
    return [f"{n} ({calibration.sources[n]})" for n in names]


def floor_of(config: SimConfig, calibration: Calibration) -> float:
    return drift_model.precision_floor(
        config.precision,
        four_over_six=config.four_over_six,
        bf16_last_15=config.bf16_last_15,
        bf16_shared_experts=config.bf16_shared_experts,
        floors=calibration.floors,
    )


def spikes_of(config: SimConfig) -> drift_model.SpikeLaw:
    return drift_model.spike_law(
        config.precision, four_over_six=config.four_over_six, dequantized_backward=config.dequantized_backward
    )


def run_config(
    config: SimConfig, calibration: Calibration, timeline: Timeline | None = None, costs: list[float] | None = None
) -> Run:
    """Timeline (unless given) and dynamics of ``config``; ``costs``, the timeline's step costs, if known."""
    if timeline is None:
        timeline = build_timeline(config, *step_seconds(config, calibration))
    floor = floor_of(config, calibration)
    costs = step_costs(timeline) if costs is None else costs
    dynamics = run_dynamics(costs, floor, spikes_of(config), config.seed)
    return Run(config, timeline, dynamics, floor)


def sync_bf16(config: SimConfig) -> SimConfig:
    """The baseline of ``config``: synchronous BF16 on the same workload and samplers."""
    return config.with_(precision="bf16", max_staleness=0)


def simulate(config: SimConfig, calibration: Calibration | None = None, *, ghosts: bool = True) -> SimResult:
    """Simulate ``config``; with ``ghosts``, also the other two precisions (same knobs otherwise)."""
    calibration = published() if calibration is None else calibration
    run = run_config(config, calibration)
    others = {}
    if ghosts:
        for precision in drift_model.PRECISIONS:
            if precision != config.precision:
                others[precision] = run_config(config.with_(precision=precision), calibration)
    return SimResult(run, sync_bf16_seconds(config, calibration), calibration, others)
