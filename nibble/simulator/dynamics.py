"""docs/design.md §7's drift and reward dynamics, driven by the batches of a timeline."""

from __future__ import annotations

from dataclasses import dataclass

from nibble.simulator import drift_model
from nibble.simulator.rng import DYNAMICS_STREAM, Mulberry32
from nibble.simulator.timeline import Rollout, Timeline

# Drift is held below this so a collapsed run's curve stays finite (the map grows quadratically after
# collapse and would overflow); it changes nothing else: the run collapsed at 2.2.
DRIFT_CEILING = 10.0
# Steps over which the steady mismatch of a run is averaged (verdict, headroom).
STEADY_WINDOW = 20


@dataclass(frozen=True)
class Dynamics:
    """Per-step curves (index = train step) and what they add up to."""

    mismatch: list[float]  # m per batch, nats/token
    drift: list[float]  # after the step
    reward: list[float]  # after the step
    spikes: list[int]  # steps that took a gradient spike
    collapsed_at: int | None  # index (from 0) of the first step whose drift exceeded 2.2
    steady_mismatch: float  # mean m over the last STEADY_WINDOW steps
    verdict: str  # stable | will_diverge | diverged


def rollout_cost(rollout: Rollout, version: int) -> float:
    """Staleness cost of a trajectory consumed at trainer ``version``: ``0.011 · gap^1.5``, weighted by the
    share of its generation time spent on each version (one share of 1 without in-flight swaps)."""
    cost = 0.0
    for seg_version, seconds in rollout.segments:
        cost = cost + (seconds / rollout.generation_seconds) * drift_model.staleness_cost(version - seg_version)
    return cost


def step_costs(timeline: Timeline) -> list[float]:
    """Mean staleness cost of each train step's batch."""
    out = []
    for step in timeline.steps:
        total = 0.0
        for rid in step.rollouts:
            total = total + rollout_cost(timeline.rollouts[rid], step.index)
        out.append(total / len(step.rollouts))
    return out


def run_dynamics(costs: list[float], floor: float, spikes: drift_model.SpikeLaw, seed: int) -> Dynamics:
    """Iterate drift and reward over the steps' staleness costs ``costs`` with precision floor ``floor``.

    Order per step: ``m = cost + 0.5·f``; one uniform draw decides the spike (drawn for every precision,
    so runs that differ only in precision share their draws); drift moves; collapse is checked; reward
    moves with the new drift.
    """
    rng = Mulberry32(seed, DYNAMICS_STREAM)
    drift, reward, collapsed_at = 0.0, drift_model.REWARD_START, None
    mismatch, drifts, rewards, spike_steps = [], [], [], []
    for k, cost in enumerate(costs):
        m = drift_model.batch_mismatch(cost, floor)
        draw = rng.uniform()
        kick = spikes.kick if draw < spikes.probability else 0.0
        if kick > 0:
            spike_steps.append(k)
        drift = min(DRIFT_CEILING, drift_model.drift_step(drift, drift_model.effective_mismatch(m), kick))
        if collapsed_at is None and drift > drift_model.COLLAPSE_DRIFT:
            collapsed_at = k
        reward = drift_model.reward_step(reward, m, drift, collapsed_at is not None)
        mismatch.append(m)
        drifts.append(drift)
        rewards.append(reward)
    steady = _mean(mismatch[-STEADY_WINDOW:])
    if collapsed_at is not None:
        verdict = "diverged"
    elif drift_model.will_diverge(drift, steady, spikes.mean):
        verdict = "will_diverge"
    else:
        verdict = "stable"
    return Dynamics(mismatch, drifts, rewards, spike_steps, collapsed_at, steady, verdict)


def _mean(values: list[float]) -> float:
    total = 0.0
    for v in values:
        total = total + v
    return total / len(values)
