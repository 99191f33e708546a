"""The event-level timeline: samplers generate, a queue holds trajectories, the trainer consumes batches.

Rules (docs/design.md §5, simplified to one trajectory group per sampler at a time):
- Admission control (AReaL's rule, :func:`nibble.config.admission.allowed_groups`): a sampler
  may start a group while ``started − discarded < (v + max_staleness + 1) · batch``, ``v`` the trainer's
  version; ``max_staleness = 0`` generates exactly one batch per version.
- A sampler holding an older version than the newest published one swaps before its next rollout; with
  ``weight_sync`` on, the swap pauses it for ``sync_seconds``, the pause of the simulated precision's
  format (``Calibration.weight_sync_seconds``: NVFP4 weights cost more to publish than BF16's, so the
  synchronous-BF16 baseline runs on BF16's own pause). With ``inflight_updates`` every
  sampler swaps at the publish instead, pausing its rollout in flight, whose later tokens use the new
  version.
- Completed groups queue in completion order; the trainer takes them first-in first-out, discards those
  more than ``max_staleness`` versions behind (staleness counts from the version a rollout *started*
  with), trains ``batch`` of them for ``train_seconds`` and publishes version ``v + 1``.

Simultaneous events resolve in a fixed order — completions by sampler index, then the trainer, then idle
samplers by index — so the page's JavaScript port (``web/model.js``) replays it exactly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from nibble.config.admission import allowed_groups
from nibble.simulator.config import HORIZONS, SimConfig
from nibble.simulator.rng import TIMELINE_STREAM, Mulberry32

IDLE, GENERATING, SYNCING, PAUSED = "idle", "generating", "syncing", "paused"


@dataclass
class Rollout:
    """One trajectory group. Times in seconds from the start of the run."""

    id: int
    sampler: int
    start: float
    generation_seconds: float  # generation time, pauses excluded
    version: int  # policy version it started with
    segments: list[list] = field(default_factory=list)  # [version, seconds generated with it]
    end: float | None = None  # completion time
    step: int | None = None  # train step that consumed or discarded it
    staleness: int | None = None  # trainer version − start version, when consumed or discarded
    discarded: bool = False


@dataclass(frozen=True)
class TrainStep:
    """One optimiser step: trained with policy version ``index`` (π_old), published ``index + 1`` at ``end``."""

    index: int
    start: float
    end: float
    rollouts: tuple[int, ...]


@dataclass(frozen=True)
class Pause:
    """A sampler swapping weights: no generation from ``start`` to ``end``; it holds ``version`` after."""

    sampler: int
    start: float
    end: float
    version: int


@dataclass
class Timeline:
    rollouts: list[Rollout]
    steps: list[TrainStep]
    pauses: list[Pause]
    train_seconds: float
    admission_blocked: bool  # admission control refused a sampler at least once

    @property
    def end_time(self) -> float:
        return self.steps[-1].end

    @property
    def discards(self) -> int:
        return sum(r.discarded for r in self.rollouts)

    @property
    def trainer_utilisation(self) -> float:
        """Fraction of wall-clock time the trainer spent training (summed in order, as the page does)."""
        busy = 0.0
        for step in self.steps:
            busy = busy + (step.end - step.start)
        return busy / self.end_time


@dataclass
class _Sampler:
    held: int = 0
    state: str = IDLE
    until: float = 0.0
    target: int = 0  # version being swapped in
    rollout: Rollout | None = None
    remaining: float = 0.0  # generation seconds left (in-flight swaps)
    segment_start: float = 0.0
    pause_start: float = 0.0


class _Run:
    """Mutable state of one timeline; :func:`build_timeline` drives it."""

    def __init__(self, config: SimConfig, rollout_seconds: float, train_seconds: float, sync_seconds: float):
        self.config = config
        horizon = HORIZONS[config.horizon]
        self.horizon = horizon
        self.budget_seconds = rollout_seconds * horizon.length_scale
        self.train_seconds = train_seconds
        self.sync_seconds = sync_seconds if config.weight_sync else 0.0
        self.rng = Mulberry32(config.seed, TIMELINE_STREAM)
        self.samplers = [_Sampler() for _ in range(config.num_samplers)]
        self.rollouts: list[Rollout] = []
        self.steps: list[TrainStep] = []
        self.pauses: list[Pause] = []
        self.queue: deque[Rollout] = deque()
        self.batch: list[Rollout] = []
        self.admitted = 0
        self.version = 0
        self.training_until: float | None = None
        self.training_start = 0.0
        self.blocked = False

    def complete_events(self, t: float) -> None:
        for i, s in enumerate(self.samplers):
            if s.state == IDLE or s.until != t:
                continue
            if s.state == GENERATING:
                s.rollout.end = t
                self.queue.append(s.rollout)
                s.rollout = None
                s.state = IDLE
            elif s.state == SYNCING:
                self.pauses.append(Pause(i, s.pause_start, t, s.target))
                s.held = s.target
                s.state = IDLE
            else:  # PAUSED: resume the rollout in flight on the new version
                self.pauses.append(Pause(i, s.pause_start, t, s.target))
                s.held = s.target
                s.rollout.segments.append([s.target, s.remaining])
                s.segment_start = t
                s.until = t + s.remaining
                s.state = GENERATING

    def finish_step(self, t: float) -> None:
        ids = tuple(r.id for r in self.batch)
        self.steps.append(TrainStep(self.version, self.training_start, t, ids))
        self.batch = []
        self.training_until = None
        self.version = self.version + 1
        if self.config.inflight_updates:
            self.swap_in_flight(t)

    def swap_in_flight(self, t: float) -> None:
        for s in self.samplers:
            if s.state == GENERATING:
                done = t - s.segment_start
                s.rollout.segments[-1][1] = done
                s.remaining = s.remaining - done
                if self.sync_seconds > 0:
                    s.state, s.until, s.target, s.pause_start = PAUSED, t + self.sync_seconds, self.version, t
                else:
                    s.held = self.version
                    s.rollout.segments.append([self.version, s.remaining])
                    s.segment_start = t
            elif s.state == PAUSED:
                s.target, s.until = self.version, t + self.sync_seconds

    def assemble(self, t: float) -> None:
        cap, size = self.config.max_staleness, self.config.batch
        while len(self.batch) < size and self.queue:
            rollout = self.queue.popleft()
            rollout.staleness = self.version - rollout.version
            rollout.step = self.version
            if rollout.staleness > cap:
                rollout.discarded = True
                self.admitted = self.admitted - 1
            else:
                self.batch.append(rollout)
        if len(self.batch) == size:
            self.training_start = t
            self.training_until = t + self.train_seconds

    def act(self, i: int, t: float) -> None:
        s = self.samplers[i]
        if s.held < self.version:
            if self.sync_seconds > 0:
                s.state, s.until, s.target, s.pause_start = SYNCING, t + self.sync_seconds, self.version, t
                return
            s.held = self.version
        if not self.full():
            self.admitted = self.admitted + 1
            seconds = self.budget_seconds * self.length_fraction()
            rollout = Rollout(len(self.rollouts), i, t, seconds, s.held, [[s.held, seconds]])
            self.rollouts.append(rollout)
            s.rollout, s.remaining, s.segment_start = rollout, seconds, t
            s.state, s.until = GENERATING, t + seconds
        else:
            self.blocked = True

    def full(self) -> bool:
        """Admission control: no new group while ``started − discarded ≥ (v + max_staleness + 1) · batch``."""
        return self.admitted >= allowed_groups(self.version, self.config.max_staleness, self.config.batch)

    def length_fraction(self) -> float:
        """Share of the length budget this response uses: ``min(1, min_fraction · Pareto(tail))``."""
        return min(1.0, self.horizon.min_fraction * self.rng.pareto(self.horizon.tail))

    def next_time(self) -> float:
        times = [s.until for s in self.samplers if s.state != IDLE]
        if self.training_until is not None:
            times.append(self.training_until)
        if not times:
            raise RuntimeError("timeline deadlock: no sampler busy and the trainer idle (a bug)")
        return min(times)


def build_timeline(config: SimConfig, rollout_seconds: float, train_seconds: float, sync_seconds: float) -> Timeline:
    """Simulate ``config.steps`` train steps.

    Args:
        rollout_seconds: seconds one sampler takes for a response at the full 8k-token budget.
        train_seconds: seconds of one train step.
        sync_seconds: weight-swap pause per sampler, the pause of ``config.precision``'s format (ignored when
            ``config.weight_sync`` is off).
    """
    run = _Run(config, rollout_seconds, train_seconds, sync_seconds)
    t = 0.0
    while True:
        run.complete_events(t)
        if run.training_until == t:
            run.finish_step(t)
            if len(run.steps) == config.steps:
                break
        if run.training_until is None:
            run.assemble(t)
        for i, s in enumerate(run.samplers):
            if s.state == IDLE and (s.held < run.version or not run.full()):
                run.act(i, t)
            elif s.state == IDLE:
                run.blocked = True
        t = run.next_time()
    return Timeline(run.rollouts, run.steps, run.pauses, train_seconds, run.blocked)
