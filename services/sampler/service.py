"""The sampler loop: swap weights between batches, reserve admission slots, generate, score, write."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from nibble.config import RedisConfig, SamplerConfig
from nibble.config.admission import allowed_groups
from nibble.monitoring.metrics import Metrics
from nibble.sampler.engine import Engine, EngineUnavailable
from nibble.sampler.rollout import GenerationFailed, Sampling, ScoredGroup, rollout
from nibble.tasks import Task
from nibble.transport.stream import AdmissionCounter, TrajectoryWriter
from nibble.transport.stream.presence import SamplerRegistry
from nibble.transport.weights import FetchFailed, VersionUnavailable, WeightRejected, WeightSubscriber

log = logging.getLogger("nibble.sampler")


EXIT_ENGINE_FAILED = 3
"""Exit status of a sampler whose engine failed ``sampler.max_engine_failures`` batches in a row."""


FETCH_RETRY_FIRST_SECONDS, FETCH_RETRY_MAX_SECONDS = 0.5, 30.0
"""A fetch that failed in transport is retried after 0.5 s, doubling to at most 30 s."""


class EngineFailed(RuntimeError):
    """The generation engine failed ``sampler.max_engine_failures`` consecutive batches."""


@dataclass
class SamplerStats:
    groups_written: int = 0
    groups_not_written: int = 0
    responses_removed: int = 0
    tokens: int = 0
    engine_failures: int = 0


@dataclass(frozen=True)
class SamplerSettings:
    """The sampler's config section plus the few run-wide values it needs (not the whole run config;
    :func:`nibble.sampler.main.settings` takes them from it).

    Attributes:
        sampler: the ``sampler`` section.
        redis: the stream's section (admission lease, heartbeat and connect timings).
        max_staleness: the oldest version lag the trainer accepts (``trainer.max_staleness``).
        groups_per_version: groups the trainer consumes per published version
            (``trainer.groups_per_step × trainer.publish_every``).
    """

    sampler: SamplerConfig
    redis: RedisConfig
    max_staleness: int
    groups_per_version: int


class Sampler:
    """One sampler process's work: :func:`~nibble.sampler.rollout.rollout` batches and the I/O around
    them (admission, stream writes, weight swaps, metrics). ``run()`` returns when ``stop`` is set.

    Admission (AReaL's rule, docs/design.md §5): a group may start while groups started ≤
    ``(v + max_staleness + 1) × groups_per_version`` with ``v`` the trainer's version, so samplers never
    run more than ``max_staleness`` versions ahead of what the trainer will accept.
    """

    def __init__(
        self,
        settings: SamplerSettings,
        task: Task,
        engine: Engine,
        writer: TrajectoryWriter,
        admission: AdmissionCounter,
        subscriber: WeightSubscriber | None,
        metrics: Metrics,
        name: str = "sampler",
        stats_file: Path | None = None,
        registry: SamplerRegistry | None = None,
    ):
        self.settings, self.config, self.task, self.engine = settings, settings.sampler, task, engine
        self.writer, self.admission, self.subscriber, self.metrics = writer, admission, subscriber, metrics
        self.registry = registry
        self.sampler_id = f"{name}-{uuid.uuid4().hex[:8]}"  # unique per process: trajectory ids never repeat
        self.sampling = Sampling(
            group_size=self.config.group_size,
            max_new_tokens=self.config.max_new_tokens or task.max_response_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
        )
        self.stop = threading.Event()
        self.stats = SamplerStats()
        self.stats_file = stats_file
        self._started = time.time()
        self._counter = itertools.count()
        self._examples = task.train_stream(seed=hash(self.sampler_id) % 2**31)
        self._pending_version: tuple[int, float] | None = None
        self._pending_lock = threading.Lock()
        self._failures_in_a_row = 0
        self._fetch_retry_at = 0.0  # time.monotonic() before which a failed fetch is not retried
        self._fetch_backoff = FETCH_RETRY_FIRST_SECONDS

    # -- weights -------------------------------------------------------------------------------------

    def watch_versions(self) -> None:
        """Background thread: remember the newest announced version (applied between batches)."""
        if self.subscriber is None:
            return
        for announcement in self.subscriber.watch(after_version=self.engine.policy_version):
            with self._pending_lock:
                self._pending_version = (announcement.policy_version, announcement.published_at)

    def maybe_update_weights(self) -> None:
        """Apply the newest announced version, if any (between batches only).

        A version that fails verification or does not fit the model is dropped (``bad_manifest``); a fetch
        that fails in transport (weight-sync away, a cut connection, a stalled stream), or an engine whose
        server cannot be reached during the swap (:class:`EngineUnavailable`), leaves the sampler serving its
        current version and is retried with backoff (``fetch_failed``) until it succeeds or a newer version
        is announced.
        """
        if time.monotonic() < self._fetch_retry_at:
            return
        with self._pending_lock:
            pending, self._pending_version = self._pending_version, None
        if pending is None or pending[0] <= self.engine.policy_version:
            return
        version, published_at = pending
        try:  # an engine that loads from disk reads weight-sync's export of the version itself
            manifest, state = (None, None) if self.engine.loads_from_disk else self.subscriber.fetch(version)
        except (WeightRejected, VersionUnavailable) as exc:
            log.warning("version %d rejected: %s", version, exc)  # corrupt, or rotated out: a newer comes
            self.metrics.rejected.labels(reason="bad_manifest").inc()
            return
        except FetchFailed as exc:
            self._retry_fetch_later(pending, exc)
            return
        try:
            self._swap(version, state)
        except EngineUnavailable as exc:  # an engine's server away: like a fetch cut off, retried later
            self._retry_fetch_later(pending, exc)
            return
        self._fetch_backoff = FETCH_RETRY_FIRST_SECONDS
        self.metrics.policy_version.labels(role="sampler").set(self.engine.policy_version)
        if manifest is not None:
            self.metrics.weight_bytes.labels(role="sampler").inc(manifest.total_bytes)
        if self.engine.policy_version == version:
            self.metrics.weight_sync_seconds.observe(max(0.0, time.time() - published_at))

    def _swap(self, version: int, state) -> None:
        """pause → update_weights → resume; a version that does not fit is dropped (``bad_manifest``).

        Raises:
            EngineUnavailable: the engine's server could not be reached (its version is unchanged).
        """
        self.engine.pause()
        try:
            self.engine.update_weights(version, state)
        except ValueError as exc:
            log.warning("version %d does not fit the model: %s", version, exc)
            self.metrics.rejected.labels(reason="bad_manifest").inc()
        finally:
            self.engine.resume()

    def _retry_fetch_later(self, pending: tuple[int, float], exc: Exception) -> None:
        """Keep ``pending`` (unless a newer version was announced meanwhile) for a retry after backoff."""
        log.warning(
            "fetching version %d failed (%s); serving version %d, retrying in %.1f s",
            pending[0], f"{type(exc).__name__}: {exc}", self.engine.policy_version, self._fetch_backoff,
        )  # fmt: skip
        self.metrics.rejected.labels(reason="fetch_failed").inc()
        with self._pending_lock:
            if self._pending_version is None or self._pending_version[0] < pending[0]:
                self._pending_version = pending
        self._fetch_retry_at = time.monotonic() + self._fetch_backoff
        self._fetch_backoff = min(2 * self._fetch_backoff, FETCH_RETRY_MAX_SECONDS)

    # -- generation ----------------------------------------------------------------------------------

    def reserve(self) -> int:
        """Reserve up to ``groups_per_batch`` admission slots; return how many were granted.

        Nothing is reserved while this sampler's weights are older than the trainer accepts
        (``trainer version − max_staleness``): such groups would only be dropped as stale.
        """
        staleness = self.settings.max_staleness
        version = self.admission.trainer_version()
        if self.engine.policy_version < version - staleness:
            return 0
        granted = 0
        allowed = allowed_groups(version, staleness, self.settings.groups_per_version)
        while granted < self.config.groups_per_batch and self.admission.reserve(allowed, self.sampler_id):
            granted += 1
        return granted

    def step(self) -> bool:
        """One generation batch; returns False when it could not start (backpressure or no slots).

        Whatever this batch reserved and did not write is given back before returning, whether the batch
        succeeded, wrote fewer groups, or failed (a dead process's slots come back with its lease).

        Raises:
            EngineFailed: the engine failed ``sampler.max_engine_failures`` batches in a row.
        """
        self.maybe_update_weights()
        if self.writer.backpressure():
            return False
        granted = self.reserve()
        if not granted:
            return False
        examples = [next(self._examples) for _ in range(granted)]
        written = 0
        try:
            groups = self.generate(examples)
            if groups is not None:
                written = self.write(groups)
        finally:
            self.admission.release(granted - written, holder=self.sampler_id)
        return True

    def generate(self, examples) -> list[ScoredGroup] | None:
        """One :func:`rollout` of ``examples``, or ``None`` after an engine error (logged, counted).

        Raises:
            EngineFailed: this was the ``max_engine_failures``-th failed batch in a row.
        """
        s = self.config
        try:
            groups = rollout(
                self.engine,
                self.task,
                examples,
                self.sampling,
                seed=next(self._counter),
                sampler_id=self.sampler_id,
                naming=self._names,
                started_at=time.time(),
            )
        except GenerationFailed as failed:
            exc = failed.__cause__
            self._failures_in_a_row += 1
            self.stats.engine_failures += 1
            log.warning(
                "generation failed (%d of %d in a row): %s: %s",
                self._failures_in_a_row, s.max_engine_failures, type(exc).__name__, exc, exc_info=exc,
            )  # fmt: skip
            if self._failures_in_a_row >= s.max_engine_failures:
                raise EngineFailed(
                    f"the generation engine failed {self._failures_in_a_row} batches in a row; last error: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            return None
        self._failures_in_a_row = 0
        self._fetch_retry_at = 0.0  # time.monotonic() before which a failed fetch is not retried
        self._fetch_backoff = FETCH_RETRY_FIRST_SECONDS
        return groups

    def _names(self, example, responses: int) -> tuple[list[str], str]:
        """This sampler's ids for one group (its counter: trajectory ids never repeat in the process)."""
        ids = [f"{self.sampler_id}-{next(self._counter)}" for _ in range(responses)]
        return ids, f"{self.sampler_id}-g{next(self._counter)}"

    def write(self, groups: list[ScoredGroup]) -> int:
        """Count and write one batch's scored groups; returns how many were written (each turning one of
        this sampler's reservations into a written group in the same Redis transaction)."""
        written = 0
        for scored in groups:
            self.stats.responses_removed += scored.removed
            if scored.removed:
                self.metrics.rejected.labels(reason="bad_response").inc(scored.removed)
            tokens = sum(scored.response_tokens)
            self.stats.tokens += tokens
            self.metrics.tokens.labels(role="sampler").inc(tokens)
            for length in scored.response_tokens:
                self.metrics.response_tokens.observe(length)
            if scored.group is None:
                self.stats.groups_not_written += 1
                continue
            try:
                self.writer.write(scored.group, also=lambda pipe: self.admission.commit(self.sampler_id, pipe))
            except ValueError as exc:  # refused by the stream's validation: never written, slot given back
                log.warning("%s", exc)
                self.metrics.rejected.labels(reason="refused_group").inc()
                self.stats.groups_not_written += 1
                continue
            self.stats.groups_written += 1
            written += 1
        return written

    def write_stats(self) -> None:
        """Counters for ``nibble run``'s summary (written atomically; the file outlives the process)."""
        if self.stats_file is None:
            return
        record = {
            **asdict(self.stats),
            "sampler_id": self.sampler_id,
            "policy_version": self.engine.policy_version,
            "started_at": self._started,
            "updated_at": time.time(),
        }
        tmp = self.stats_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record) + "\n")
        tmp.replace(self.stats_file)

    def renew_lease(self) -> None:
        """Background thread: renew this sampler's admission lease three times per lease period, so its
        reservations outlive a long batch but come back soon after the process dies."""
        period = self.settings.redis.admission_lease_seconds / 3
        while not self.stop.wait(period):
            try:
                self.admission.renew(self.sampler_id)
            except Exception as exc:  # Redis lost for longer than retry_seconds: the main loop reports it
                log.warning("could not renew the admission lease: %s", exc)

    def heartbeat(self) -> None:
        """Background thread: tell the trainer this sampler is alive until ``stop``, then leave at once."""
        while True:
            try:
                self.registry.beat(self.sampler_id)
            except Exception as exc:  # a missed beat only ages this sampler out; the main loop reports Redis
                log.warning("heartbeat of %s failed: %s", self.sampler_id, exc)
            if self.stop.wait(self.settings.redis.sampler_heartbeat_seconds):
                break
        try:
            self.registry.leave(self.sampler_id)
        except Exception as exc:
            log.warning("%s could not leave the live samplers (it ages out): %s", self.sampler_id, exc)

    def run(self, idle_sleep: float = 0.05, stats_every: float = 2.0) -> None:
        """Generate until ``stop`` is set.

        Raises:
            EngineFailed: see :meth:`step` (the stats file is written first).
        """
        watcher = threading.Thread(target=self.watch_versions, name="weight-watch", daemon=True)
        watcher.start()
        threading.Thread(target=self.renew_lease, name="admission-lease", daemon=True).start()
        heart = threading.Thread(target=self.heartbeat, name="heartbeat", daemon=True)
        if self.registry is not None:  # without one (tests, a bare engine loop) nobody counts live samplers
            heart.start()
        last = 0.0
        try:
            while not self.stop.is_set():
                if not self.step():
                    self.stop.wait(idle_sleep)
                if time.monotonic() - last > stats_every:
                    self.write_stats()
                    last = time.monotonic()
        finally:
            self.stop.set()  # ends the lease and heartbeat threads
            if self.subscriber is not None:
                self.subscriber.close()  # ends the watch thread
            if heart.is_alive():
                heart.join(timeout=self.settings.redis.connect_timeout_seconds)
            self.write_stats()
