"""The dead-letter stream: what the trainer could not use, with the reason, kept for a human to inspect
and, once the cause is fixed (a config, a model, a sampler bug), to replay into the trajectory stream.

Each dead-letter entry holds ``id`` (the original entry id), ``reason`` (``"<code>: <detail>"``) and
``payload`` (the original bytes, possibly empty when the entry's data was gone).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from google.protobuf.message import DecodeError

from nibble.config import RedisConfig
from nibble.transport.stream.admission import AdmissionCounter
from nibble.transport.stream.connection import retrying
from nibble.transport.stream.redis_stream import PAYLOAD_FIELD
from nibble.transport.stream.validate import reason_code
from nibble.wire import pb


@dataclass(frozen=True)
class DeadLetter:
    """One dead-letter entry: its own id, the original entry's id, the reason and the payload bytes."""

    entry_id: str
    original_id: str
    reason: str
    payload: bytes

    @property
    def code(self) -> str:
        return reason_code(self.reason)

    def group(self) -> pb.TrajectoryGroup | None:
        """The payload as a trajectory group, or ``None`` when it does not decode as one."""
        group = pb.TrajectoryGroup()
        try:
            group.ParseFromString(self.payload)
        except DecodeError:
            return None
        return group


def _letter(entry_id: bytes, fields: dict) -> DeadLetter:
    return DeadLetter(
        entry_id=entry_id.decode(),
        original_id=fields.get(b"id", b"").decode(errors="replace"),
        reason=fields.get(b"reason", b"").decode(errors="replace"),
        payload=fields.get(b"payload", b""),
    )


def list_dead_letters(client: redis.Redis, config: RedisConfig, count: int = 100) -> list[DeadLetter]:
    """The oldest ``count`` dead-letter entries.

    Raises:
        RedisUnavailable: Redis stayed unreachable for ``retry_seconds``.
    """
    raw = retrying(
        client, config, "reading the dead-letter stream", lambda: client.xrange(config.dead_letter_stream, count=count)
    )
    return [_letter(i, f) for i, f in raw]


def get_dead_letter(client: redis.Redis, config: RedisConfig, entry_id: str) -> DeadLetter:
    """Dead-letter entry ``entry_id``.

    Raises:
        ValueError: no such entry (named).
    """
    raw = retrying(
        client,
        config,
        "reading a dead-letter entry",
        lambda: client.xrange(config.dead_letter_stream, min=entry_id, max=entry_id),
    )
    if not raw:
        raise ValueError(f"no dead-letter entry {entry_id!r} in {config.dead_letter_stream}")
    return _letter(*raw[0])


def replay(client: redis.Redis, config: RedisConfig, letters: list[DeadLetter]) -> list[str]:
    """Append each letter's payload to the trajectory stream again and remove the letter, one transaction
    per letter; each replayed group counts as started for admission control (as a written group does:
    the trainer gives the slot back if it drops or dead-letters it again). Returns the new entry ids.

    Raises:
        ValueError: a letter without a payload (nothing to replay; named).
        RedisUnavailable: Redis stayed unreachable for ``retry_seconds``.
    """
    for letter in letters:
        if not letter.payload:
            raise ValueError(f"dead-letter entry {letter.entry_id} has no payload to replay ({letter.reason})")
    started_key = AdmissionCounter(client, config).started_key
    new_ids = []
    for letter in letters:

        def command(letter=letter):
            pipe = client.pipeline(transaction=True)
            pipe.xadd(config.stream, {PAYLOAD_FIELD: letter.payload})
            pipe.incr(started_key)
            pipe.xdel(config.dead_letter_stream, letter.entry_id)
            return pipe.execute()[0]

        new_ids.append(retrying(client, config, f"replaying {letter.entry_id}", command).decode())
    return new_ids
