"""The trajectory queue on Redis: a stream of whole GRPO groups read by a consumer group (docs/design.md §5).

Samplers append with :class:`RedisTrajectoryWriter`; the trainer reads with :class:`RedisTrajectoryReader`,
which re-reads its own pending entries after a restart, claims entries pending on a silent consumer,
moves undecodable or invalid entries to the dead-letter stream, acknowledges only when told (after the
checkpoint that holds the step) and trims what every reader is done with.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

import redis
from google.protobuf.message import DecodeError

from nibble.config import RedisConfig
from nibble.monitoring.reasons import MISSING_PAYLOAD, UNDECODABLE
from nibble.transport.stream.base import StreamEntry
from nibble.transport.stream.connection import retrying
from nibble.transport.stream.validate import reason_code, validate_group
from nibble.wire import pb

logger = logging.getLogger(__name__)

T = TypeVar("T")
PAYLOAD_FIELD = b"group"  # one field per entry: the serialized pb.TrajectoryGroup


class RedisTrajectoryWriter:
    """The sampler side (a :class:`~nibble.transport.stream.base.TrajectoryWriter`): appends whole groups;
    never trims (unread data is never dropped)."""

    def __init__(self, client: redis.Redis, config: RedisConfig):
        self.client, self.config = client, config

    def write(self, group: pb.TrajectoryGroup, also: Callable[[redis.client.Pipeline], None] | None = None) -> str:
        """Append ``group`` as one entry; returns its entry id. ``also(pipe)`` may queue more commands to run
        in the same transaction (the sampler's admission commit), so a crash never separates them.

        Raises:
            ValueError: the group is invalid (``validate_group``'s reason): the sampler must not write it.
            RedisUnavailable: Redis stayed unreachable for ``retry_seconds``.
        """
        reason = validate_group(group)
        if reason is not None:
            raise ValueError(f"refusing to write trajectory group {group.group_id!r}: {reason}")
        payload = group.SerializeToString()

        def command():
            pipe = self.client.pipeline(transaction=True)
            pipe.xadd(self.config.stream, {PAYLOAD_FIELD: payload})
            if also is not None:
                also(pipe)
            return pipe.execute()[0]

        entry_id = retrying(self.client, self.config, f"writing group {group.group_id}", command)
        return entry_id.decode()

    def backpressure(self) -> bool:
        """True while undelivered groups ≥ ``queue_capacity``: the sampler should pause producing."""
        return undelivered(self.client, self.config) >= self.config.queue_capacity


class RedisTrajectoryReader:
    """The trainer side (a :class:`~nibble.transport.stream.base.TrajectoryReader`): one consumer
    (``consumer``) of the group ``config.consumer_group``.

    ``dead_lettered`` counts dead-lettered entries by reason code; ``on_dead_letter(code)`` (optional) is
    called once per entry too, e.g. to bump ``nibble_dead_lettered_total``.
    """

    def __init__(
        self,
        client: redis.Redis,
        config: RedisConfig,
        consumer: str,
        on_dead_letter: Callable[[str], None] | None = None,
    ):
        if not consumer:
            raise ValueError("a stream consumer needs a non-empty name")
        self.client, self.config, self.consumer = client, config, consumer
        self.on_dead_letter = on_dead_letter
        self.dead_lettered: Counter[str] = Counter()
        self._history_cursor: str | None = "0"  # own pending entries still to re-read; None once done
        self._claim_cursor = "0-0"
        self._held: set[str] = set()  # delivered to this reader and not yet acknowledged
        retrying(client, config, "creating the consumer group", self._create_group)

    def read(self, count: int, block_seconds: float = 0.0) -> list[StreamEntry]:
        """Up to ``count`` valid entries: first this consumer's own pending ones (once, after a restart),
        then ones claimed from consumers idle for ``claim_idle_seconds``, then new ones — waiting up to
        ``block_seconds`` for new ones when there is nothing else.

        Raises:
            ValueError: ``count`` < 1, or ``block_seconds`` not below ``socket_timeout_seconds``.
            RedisUnavailable: Redis stayed unreachable for ``retry_seconds``.
        """
        if count < 1:
            raise ValueError(f"read count {count} must be ≥ 1")
        if not 0 <= block_seconds < self.config.socket_timeout_seconds:
            raise ValueError(
                f"block_seconds={block_seconds} must be ≥ 0 and below "
                f"redis.socket_timeout_seconds={self.config.socket_timeout_seconds}"
            )
        entries = self._accept(self._read_own_pending(count))
        if len(entries) < count:
            entries += self._accept(self._claim_idle(count - len(entries)))
        if len(entries) < count:
            entries += self._accept(self._read_new(count - len(entries), 0.0 if entries else block_seconds))
        self._held.update(e.entry_id for e in entries)
        return entries

    def ack(self, entry_ids: Iterable[str]) -> int:
        """Acknowledge entries (only once the checkpoint holding their step is written); returns how many
        were still pending."""
        ids = list(entry_ids)
        if not ids:
            return 0
        acked = retrying(
            self.client,
            self.config,
            f"acknowledging {len(ids)} entries",
            lambda: self.client.xack(self.config.stream, self.config.consumer_group, *ids),
        )
        self._held.difference_update(ids)
        return int(acked)

    def trim(self) -> int:
        """Delete entries every consumer is done with: those below the oldest pending entry, or up to the
        group's last-delivered entry when nothing is pending. Undelivered entries are never removed.
        Returns the number of entries deleted."""
        oldest_pending, last_delivered = self._on_group("reading the queue state", self._snapshot)
        if oldest_pending is not None:
            min_id = oldest_pending
        elif last_delivered is not None and last_delivered != "0-0":
            min_id = _next_id(last_delivered)
        else:
            return 0
        return int(
            retrying(
                self.client,
                self.config,
                "trimming the stream",
                lambda: self.client.xtrim(self.config.stream, minid=min_id, approximate=False),
            )
        )

    def depth(self) -> int:
        """Groups waiting in the stream: undelivered plus pending (``nibble_queue_depth``)."""
        pending = self._on_group("reading the pending entries", self._pending_summary)
        return undelivered(self.client, self.config) + int(pending["pending"])

    # ---- the three sources of a read ----------------------------------------------------------

    def _read_own_pending(self, count: int) -> list[tuple[bytes, dict | None]]:
        if self._history_cursor is None:
            return []
        raw = self._xreadgroup(self._history_cursor, count, None)
        # A short page ends the history; later pages could only repeat entries read since with ">".
        self._history_cursor = raw[-1][0].decode() if len(raw) == count else None
        return [(i, f) for i, f in raw if i.decode() not in self._held]

    def _claim_idle(self, count: int) -> list[tuple[bytes, dict | None]]:
        idle_ms = int(self.config.claim_idle_seconds * 1000)
        reply = self._on_group(
            "claiming idle entries",
            lambda: self.client.xautoclaim(
                self.config.stream,
                self.config.consumer_group,
                self.consumer,
                idle_ms,
                start_id=self._claim_cursor,
                count=count,
            ),
        )
        next_cursor, claimed = reply[0], reply[1]
        self._claim_cursor = next_cursor.decode() if isinstance(next_cursor, bytes) else str(next_cursor)
        # Our own entries awaiting their checkpoint come back too once idle: they are already in hand.
        return [(i, f) for i, f in claimed if i.decode() not in self._held]

    def _read_new(self, count: int, block_seconds: float) -> list[tuple[bytes, dict | None]]:
        block_ms = max(1, round(block_seconds * 1000)) if block_seconds > 0 else None
        return self._xreadgroup(">", count, block_ms)

    def _xreadgroup(self, start: str, count: int, block_ms: int | None) -> list[tuple[bytes, dict | None]]:
        def command():
            reply = self.client.xreadgroup(
                self.config.consumer_group, self.consumer, {self.config.stream: start}, count=count, block=block_ms
            )
            return list(reply[0][1]) if reply else []

        return self._on_group("reading the stream", command)

    def _on_group(self, what: str, command: Callable[[], T]) -> T:
        """``command`` (a consumer-group command) retried while Redis is lost; a group lost with Redis's
        data (a restart without persistence) is recreated from id 0 once."""

        def recreating():
            try:
                return command()
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                logger.warning(
                    "consumer group %s of %s is gone (Redis restarted without persistence?); recreating it",
                    self.config.consumer_group,
                    self.config.stream,
                )
                self._create_group()
                return command()

        return retrying(self.client, self.config, what, recreating)

    # ---- decoding and dead-lettering ----------------------------------------------------------

    def _accept(self, raw: list[tuple[bytes, dict | None]]) -> list[StreamEntry]:
        entries = []
        for raw_id, fields in raw:
            entry_id = raw_id.decode()
            payload = (fields or {}).get(PAYLOAD_FIELD)
            group, reason = _decode(fields, payload)
            if reason is None:
                entries.append(StreamEntry(entry_id, group))
            else:
                self.dead_letter(entry_id, reason, payload or b"")
        return entries

    def dead_letter(self, entry_id: str, reason: str, payload: bytes) -> None:
        """Move entry ``entry_id`` to the dead-letter stream with ``reason`` (``"<code>: <detail>"``) and its
        ``payload``, acknowledging it in the same transaction; count it and call ``on_dead_letter(code)``.
        Used for entries that fail to decode or validate here, and by the trainer for groups its model
        cannot train on.

        Raises:
            RedisUnavailable: Redis stayed unreachable for ``retry_seconds``.
        """

        def command():
            pipe = self.client.pipeline(transaction=True)
            pipe.xadd(
                self.config.dead_letter_stream,
                {b"id": entry_id, b"reason": reason, b"payload": payload},
                maxlen=self.config.dead_letter_max_entries,
                approximate=True,
            )
            pipe.xack(self.config.stream, self.config.consumer_group, entry_id)
            return pipe.execute()

        retrying(self.client, self.config, f"dead-lettering entry {entry_id}", command)
        self._held.discard(entry_id)
        code = reason_code(reason)
        self.dead_lettered[code] += 1
        logger.warning("dead-lettered stream entry %s: %s", entry_id, reason)
        if self.on_dead_letter is not None:
            self.on_dead_letter(code)

    # ---- Redis state --------------------------------------------------------------------------

    def _create_group(self) -> None:
        try:
            self.client.xgroup_create(self.config.stream, self.config.consumer_group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _pending_summary(self) -> dict:
        return self.client.xpending(self.config.stream, self.config.consumer_group)

    def _snapshot(self) -> tuple[str | None, str | None]:
        """(oldest pending id, last-delivered id) read atomically, so no delivery falls between them."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xpending(self.config.stream, self.config.consumer_group)
        pipe.xinfo_groups(self.config.stream)
        pending, groups = pipe.execute()
        oldest = pending["min"].decode() if pending["pending"] else None
        return oldest, _last_delivered(groups, self.config.consumer_group)


def undelivered(client: redis.Redis, config: RedisConfig) -> int:
    """Entries of ``config.stream`` not yet delivered to the consumer group (all of them before the
    trainer has created the group)."""
    return retrying(client, config, "counting undelivered entries", lambda: _count_undelivered(client, config))


def _count_undelivered(client: redis.Redis, config: RedisConfig) -> int:
    try:
        groups = client.xinfo_groups(config.stream)
    except redis.ResponseError:  # no stream yet
        return 0
    group = next((g for g in groups if _text(g["name"]) == config.consumer_group), None)
    if group is None:
        return int(client.xlen(config.stream))
    if group.get("lag") is not None:  # Redis ≥ 7 keeps the count, unless entries were deleted with XDEL
        return int(group["lag"])
    count, start = 0, "(" + _text(group["last-delivered-id"])
    while page := client.xrange(config.stream, min=start, count=1000):
        count += len(page)
        start = "(" + page[-1][0].decode()
    return count


def _decode(fields: dict | None, payload: bytes | None) -> tuple[pb.TrajectoryGroup | None, str | None]:
    if fields is None or not fields:
        return None, f"{MISSING_PAYLOAD}: the entry's data was deleted from the stream"
    if payload is None:
        names = ", ".join(_text(k) for k in fields)
        return None, f"{UNDECODABLE}: no {PAYLOAD_FIELD.decode()!r} field (fields: {names})"
    group = pb.TrajectoryGroup()
    try:
        group.ParseFromString(payload)
    except DecodeError as exc:
        return None, f"{UNDECODABLE}: {exc}"
    return group, validate_group(group)


def _last_delivered(groups: list[dict], name: str) -> str | None:
    for group in groups:
        if _text(group["name"]) == name:
            return _text(group["last-delivered-id"])
    return None


def _next_id(entry_id: str) -> str:
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
