"""The trajectory queue on a Redis stream, and admission control over it (DESIGN.md §5)."""

from nibble.transport.admission import AdmissionCounter, allowed_groups
from nibble.transport.connection import RedisUnavailable, connect, read_password, retrying
from nibble.transport.stream import StreamEntry, TrajectoryReader, TrajectoryWriter, undelivered
from nibble.transport.validate import REASONS, reason_code, validate_group

__all__ = [
    "REASONS",
    "AdmissionCounter",
    "RedisUnavailable",
    "StreamEntry",
    "TrajectoryReader",
    "TrajectoryWriter",
    "allowed_groups",
    "connect",
    "read_password",
    "reason_code",
    "retrying",
    "undelivered",
    "validate_group",
]
