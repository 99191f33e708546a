"""The trajectory stream's interface (docs/design.md §5): what a sampler writes through and the trainer reads
from, whatever carries it. :mod:`nibble.transport.stream.redis_stream` implements it on a Redis stream.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from nibble.wire import pb


@dataclass(frozen=True)
class StreamEntry:
    """One decoded, validated stream entry: a whole group and the id to acknowledge it by."""

    entry_id: str
    group: pb.TrajectoryGroup


class TrajectoryWriter(Protocol):
    """The sampler's side: appends whole, valid trajectory groups."""

    def write(self, group: pb.TrajectoryGroup, also: Callable[[Any], None] | None = None) -> str:
        """Append ``group`` as one entry and return its entry id; ``also`` queues more commands on the
        same atomic write (the sampler's admission commit; Redis passes its transaction pipeline).

        Raises:
            ValueError: the group is invalid; it must not be written.
        """
        ...

    def backpressure(self) -> bool:
        """True while the stream holds as many undelivered groups as it should: the sampler pauses."""
        ...


class TrajectoryReader(Protocol):
    """The trainer's side: reads valid groups, acknowledges them once checkpointed, dead-letters the rest.

    Attributes:
        dead_lettered: entries dead-lettered by this reader, by reason code.
    """

    dead_lettered: Counter[str]

    def read(self, count: int, block_seconds: float = 0.0) -> list[StreamEntry]:
        """Up to ``count`` valid entries, waiting up to ``block_seconds`` (seconds) when none is ready."""
        ...

    def ack(self, entry_ids: Iterable[str]) -> int:
        """Acknowledge entries (once the checkpoint holding their step is written); returns how many were
        still pending."""
        ...

    def trim(self) -> int:
        """Delete the entries every reader is done with; returns how many."""
        ...

    def depth(self) -> int:
        """Groups waiting in the stream: undelivered plus delivered and unacknowledged."""
        ...

    def dead_letter(self, entry_id: str, reason: str, payload: bytes) -> None:
        """Move entry ``entry_id`` aside with ``reason`` (``"<code>: <detail>"``) and its ``payload``."""
        ...
