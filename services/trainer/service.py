"""The trainer loop: consume whole groups, train, publish versions, checkpoint, then acknowledge."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nibble.config import TrainerConfig
from nibble.model import MoETransformer
from nibble.monitoring.metrics import Metrics
from nibble.simulator.drift_model import drift_headroom
from nibble.tasks import Task
from nibble.tasks.evaluation import EvaluationStopped, accuracy
from nibble.trainer import checkpoint
from nibble.trainer.batch import assemble
from nibble.trainer.demand import sampler_demand
from nibble.trainer.intake import untrainable_reason
from nibble.trainer.parallel import SINGLE_PROCESS, Parallelism
from nibble.trainer.step import StepResult, train_on_batch
from nibble.transport.stream import AdmissionCounter, StreamEntry, TrajectoryReader
from nibble.transport.stream.presence import SamplerRegistry
from nibble.transport.weights import WeightPublisher

log = logging.getLogger("nibble.trainer")


class Stopped(Exception):
    """Raised inside the loop when a shutdown was requested."""


class StepAbandoned(Exception):
    """A shutdown interrupted a step's evaluation: the step is dropped, not checkpointed (its entries are
    not acknowledged), and a resumed trainer does it again."""


@dataclass
class Consumed:
    """Groups taken from the stream for one step, and the entries to acknowledge after the checkpoint."""

    groups: list = field(default_factory=list)
    entry_ids: list[str] = field(default_factory=list)
    trajectory_ids: set[str] = field(default_factory=set)
    idle_seconds: float = 0.0


@dataclass(frozen=True)
class TrainerSettings:
    """The trainer's config section plus the few run-wide values it needs (not the whole run config;
    :func:`nibble.trainer.main.settings` takes them from it).

    Attributes:
        trainer: the ``trainer`` section.
        sampler_temperature: the temperature samplers sample at (a group at another one is untrainable).
        num_samplers: the samplers the run starts, for the demand estimate when none report as live.
        provenance: recorded in every checkpoint (:func:`nibble.rundir.provenance.provenance` of the run).
    """

    trainer: TrainerConfig
    sampler_temperature: float
    num_samplers: int
    provenance: dict = field(default_factory=dict)


@dataclass
class Policy:
    """What training changes and checkpoints: the model, its optimiser and the counters beside them."""

    model: MoETransformer
    optimizer: torch.optim.Optimizer
    state: checkpoint.TrainerState


@dataclass
class Links:
    """The leader's links to the outside; other processes (and tests without Redis) hold none.

    ``reader``: the trajectory stream. ``admission``: the samplers' admission counter. ``publisher``:
    weight-sync (``None``: versions only counted). ``samplers``: live samplers (``None``: the run's
    ``num_samplers``).
    """

    reader: TrajectoryReader | None = None
    admission: AdmissionCounter | None = None
    publisher: WeightPublisher | None = None
    samplers: SamplerRegistry | None = None


class Trainer:
    """One trainer process's work; :meth:`run` trains until ``trainer.total_steps``.

    The ``parallel`` leader alone reads the stream, publishes, acknowledges and records metrics; it
    broadcasts each consumed batch, or the stop, and every process trains, evaluates, gathers the
    published weights and checkpoints together (one process: it does all of it).
    """

    def __init__(
        self,
        settings: TrainerSettings,
        task: Task,
        policy: Policy,
        links: Links,
        metrics: Metrics,
        out: Path,
        parallel: Parallelism = SINGLE_PROCESS,
        stop: threading.Event | None = None,
    ):
        self.settings, self.config, self.task, self.parallel = settings, settings.trainer, task, parallel
        self.model, self.optimizer, self.state = policy.model, policy.optimizer, policy.state
        self.reader, self.admission, self.publisher = links.reader, links.admission, links.publisher
        self.samplers, self.metrics = links.samplers, metrics
        self.ledger = checkpoint.Ledger(self.config.ledger_size, self.state.trained)
        self.dropped = checkpoint.Ledger(self.config.ledger_size, self.state.stale_dropped)
        self.unacked: list[str] = []
        # Entries dropped as stale since the last checkpoint: a trainer that stops before its next step is
        # checkpointed still records them (see _keep_drops), or a resumed one would drop them again and give
        # their admission slots back a second time.
        self.dropped_unacked: list[str] = []
        self.out = out
        self.metrics_file = out / "metrics.jsonl"
        self.stop = stop or threading.Event()
        self.stale_dropped_total = 0
        self.leader = parallel.leader
        self.checkpointed_step = self.state.step

    # -- consuming -----------------------------------------------------------------------------------

    def consume(self) -> Consumed:
        """Read until ``groups_per_step`` fresh-enough, untrained groups are in hand."""
        t = self.config
        consumed = Consumed()
        while len(consumed.groups) < t.groups_per_step:
            if self.stop.is_set():
                raise Stopped
            started = time.monotonic()
            entries = self.reader.read(count=t.groups_per_step - len(consumed.groups), block_seconds=1.0)
            consumed.idle_seconds += time.monotonic() - started  # waiting on the stream, data or not
            if not entries:
                continue
            for entry in entries:
                self._take(entry, consumed)
        return consumed

    def _take(self, entry: StreamEntry, consumed: Consumed) -> None:
        """Add ``entry``'s group to ``consumed`` unless it was seen before (redelivery, duplicate ``XADD``),
        cannot be trained by this model (dead-lettered: the reader acknowledges it, counts it and the
        admission slot comes back through ``on_dead_letter``) or is too stale (dropped, slot released)."""
        group = entry.group
        ids = [r.trajectory_id for r in group.responses]
        if all(i in self.ledger or i in self.dropped or i in consumed.trajectory_ids for i in ids):
            consumed.entry_ids.append(entry.entry_id)
            return  # a redelivery or duplicate XADD: already trained, dropped, or in this batch
        reason = untrainable_reason(group, self.model.config, self.settings.sampler_temperature)
        if reason is not None:
            self.reader.dead_letter(entry.entry_id, reason, group.SerializeToString())
            return
        staleness = self.state.policy_version - group.policy_version
        if staleness > self.config.max_staleness:
            for i in ids:
                self.dropped.add(i)
            self.dropped_unacked.append(entry.entry_id)
            self.metrics.stale_dropped.inc(len(ids))
            self.stale_dropped_total += len(ids)
            self.admission.release(1)
            return
        consumed.entry_ids.append(entry.entry_id)
        consumed.groups.append(group)
        consumed.trajectory_ids.update(ids)
        for _ in group.responses:
            self.metrics.staleness.observe(staleness)

    # -- one step ------------------------------------------------------------------------------------

    def next_consumed(self) -> Consumed:
        """The next batch's groups, read by the leader and broadcast to every process.

        Raises:
            Stopped: a shutdown was requested (on the leader, for every process).
        """
        consumed = None
        if self.leader:
            try:
                consumed = self.consume()
            except Stopped:
                consumed = None
        consumed = self.parallel.broadcast(consumed)
        if consumed is None:
            raise Stopped
        return consumed

    def step(self) -> StepResult:
        started = time.monotonic()
        consumed = self.next_consumed()
        batch = assemble(consumed.groups, self.state.policy_version)
        result = train_on_batch(self.model, self.optimizer, batch, self.config, parallel=self.parallel)
        for trajectory_id in batch.trajectory_ids:
            self.ledger.add(trajectory_id)
        self.unacked += consumed.entry_ids
        self.state.step += 1
        t = self.config
        evaluated = self.state.step % t.eval_every == 0 or self.state.step == t.total_steps
        if evaluated:
            self.evaluate()
        if self.state.step % t.publish_every == 0:
            self.publish()
        if self.leader:
            self._report(result, batch, consumed, evaluated, time.monotonic() - started)
        if self.state.step % t.checkpoint_every == 0 or self.state.step == t.total_steps:
            self.checkpoint()
        return result

    def _report(self, result: StepResult, batch, consumed: Consumed, evaluated: bool, seconds: float) -> None:
        """Metrics and the ``metrics.jsonl`` line of one step (the leader only)."""
        t = self.config
        self.metrics.trainer_idle_seconds.inc(consumed.idle_seconds)
        self._record(result, batch, consumed, evaluated)
        depth = self.reader.depth()
        self.metrics.queue_depth.set(depth)
        self.metrics.sampler_demand.set(
            sampler_demand(
                self.samplers.live() if self.samplers is not None else self.settings.num_samplers,
                consumed.idle_seconds,
                seconds,
                depth,
                t.groups_per_step,
                t.max_staleness,
            )
        )

    def continue_above(self, published: int) -> None:
        """Resume versions above ``published`` (the highest ever published, 0 when none).

        Versions above the checkpoint's came from steps lost in a crash (a step publishes before it
        checkpoints): their numbers are never reused for other weights, so the resumed weights go out at
        once as ``published + 1`` and samplers leave the lost branch. Every process calls this.
        """
        if published <= self.state.policy_version:
            if self.admission is not None:
                self.admission.set_trainer_version(self.state.policy_version)
            self.metrics.policy_version.labels(role="trainer").set(self.state.policy_version)
            return
        log.warning(
            "versions %d..%d were published from steps after checkpoint step %d (lost); publishing the resumed "
            "weights as version %d",
            self.state.policy_version + 1, published, self.state.step, published + 1,
        )  # fmt: skip
        self.state.policy_version = published
        self.publish()

    def publish(self) -> None:
        """Publish the next version (every process helps gather it, the leader sends it)."""
        version = self.state.policy_version + 1
        state = self.parallel.published_state(self.model)
        if self.publisher is not None:
            reply = self.publisher.publish(version, state, self.model.plan)
            self.metrics.weight_bytes.labels(role="trainer").inc(reply.bytes_received)
        self.state.policy_version = version
        if self.admission is not None:
            self.admission.set_trainer_version(version)
        self.metrics.policy_version.labels(role="trainer").set(version)

    def evaluate(self) -> None:
        """Held-out accuracy; a shutdown stops it between batches where the processes may stop on their own
        (:attr:`Parallelism.stops_early`; sharded ranks decode in collectives, so they finish it together).

        Raises:
            StepAbandoned: ``stop`` was set meanwhile.
        """
        self.model.eval()
        early = self.parallel.stops_early
        try:
            self.state.eval_accuracy = accuracy(
                self.model, self.task, stop_early=early, should_stop=self.stop.is_set if early else None
            )
        except EvaluationStopped:
            raise StepAbandoned from None
        self.model.train()
        self.metrics.eval_accuracy.set(self.state.eval_accuracy)

    def checkpoint(self) -> None:
        """Persist the step, then acknowledge and trim the entries it consumed (docs/design.md §5)."""
        self.state.trained = self.ledger.ids()
        self.state.stale_dropped = self.dropped.ids()
        self.state.provenance = self.settings.provenance
        checkpoint.save(self.config.checkpoint_dir, self.model, self.optimizer, self.state, parallel=self.parallel)
        self.checkpointed_step = self.state.step
        if not self.leader:
            return
        if self.unacked or self.dropped_unacked:
            self.reader.ack(self.unacked + self.dropped_unacked)
            self.unacked, self.dropped_unacked = [], []
        self.reader.trim()

    def _keep_drops(self) -> None:
        """Add the stale drops made since the last checkpoint to it, then acknowledge their entries (leader;
        for a trainer stopping without checkpointing the step under way).

        The checkpoint's weights, optimiser and trained ledger still match (the stopped step trained nothing
        that is kept), so only its ``stale_dropped`` grows: a drop has already given its admission slot back
        and been counted, and redone after a resume it would give the slot back again.
        """
        if not self.leader or not self.dropped_unacked:
            return
        path = checkpoint.latest(self.config.checkpoint_dir)
        if path is None:  # nothing checkpointed yet: the entries stay pending and are judged again
            return
        checkpoint.save_stale_dropped(path, self.dropped.ids())
        self.reader.ack(self.dropped_unacked)
        self.dropped_unacked = []

    def _record(self, result: StepResult, batch, consumed: Consumed, evaluated: bool) -> None:
        m, stats = self.metrics, result.stats
        m.mismatch_kl.set(stats["mismatch_kl"])
        m.logprob_abs_diff.set(stats["logprob_abs_diff"])
        if result.fresh is not None:
            m.fresh_mismatch_kl.set(result.fresh["mismatch_kl"])
            m.fresh_logprob_abs_diff.set(result.fresh["logprob_abs_diff"])
        m.is_clipped_fraction.set(stats["is_clipped_fraction"])
        m.grad_norm.set(result.grad_norm)
        m.skipped_steps.inc(result.skipped_updates)
        m.entropy.set(result.entropy)
        m.reward_mean.set(float(batch.rewards.mean()))
        m.truncated_fraction.set(float(batch.truncated.float().mean()))
        m.zero_std_group_fraction.set(result.zero_std_groups / batch.num_groups)
        m.tokens.labels(role="trainer").inc(result.trained_tokens)
        m.drift_headroom.set(drift_headroom(stats["logprob_abs_diff"]))
        for w in result.is_weights.tolist():
            m.is_weight.observe(w)
        line = {
            "step": self.state.step,
            "policy_version": self.state.policy_version,
            "time": time.time(),
            "loss": result.loss,
            "grad_norm": result.grad_norm,
            "reward_mean": float(batch.rewards.mean()),
            "staleness_mean": float(batch.staleness.float().mean()),
            "staleness_max": int(batch.staleness.max()),
            "idle_seconds": consumed.idle_seconds,
            "trained_tokens": result.trained_tokens,
            "trained_trajectories": len(batch.trajectory_ids),
            "entropy": result.entropy,
            "eval_accuracy": self.state.eval_accuracy if evaluated else None,
            "stale_dropped_total": self.stale_dropped_total,
            "dead_lettered_total": sum(self.reader.dead_lettered.values()),
            **{k: float(v) for k, v in stats.items()},
            "fresh_mismatch_kl": None if result.fresh is None else result.fresh["mismatch_kl"],
            "fresh_logprob_abs_diff": None if result.fresh is None else result.fresh["logprob_abs_diff"],
        }
        with self.metrics_file.open("a") as handle:
            handle.write(json.dumps(line) + "\n")

    def run(self) -> bool:
        """Train until ``total_steps`` (True) or until ``stop`` is set (False: the step under way finishes
        and is checkpointed, so a resumed trainer loses nothing; entries read for the next, unfinished step
        are not acknowledged and are redelivered to it)."""
        try:
            if self.state.step == 0 and self.state.eval_accuracy is None:
                self.evaluate()  # the warm start's held-out accuracy: the "before" of the run
                if self.leader:
                    with self.metrics_file.open("a") as handle:
                        line = {"step": 0, "time": time.time(), "eval_accuracy": self.state.eval_accuracy}
                        handle.write(json.dumps(line) + "\n")
            while self.state.step < self.config.total_steps:
                self.step()
        except StepAbandoned:
            self._keep_drops()
            log.info(
                "stopped at step %d (checkpointed); step %d was evaluating and is dropped, a resumed trainer redoes it",
                self.checkpointed_step,
                self.state.step,
            )
            return False
        except Stopped:
            if self.state.step > self.checkpointed_step:  # checkpoint_every > 1: keep the steps since the last
                self.checkpoint()
            else:  # stopped while reading the next step's groups, some of them maybe dropped as stale
                self._keep_drops()
            log.info("stopped at step %d (checkpointed)", self.state.step)
            return False
        return True
