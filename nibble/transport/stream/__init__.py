"""The trajectory stream (sampler → trainer, docs/design.md §5): the :class:`TrajectoryWriter` and
:class:`TrajectoryReader` interfaces, their Redis implementation, admission control, the validation of a
group, dead letters and sampler presence."""

from nibble.transport.stream.admission import AdmissionCounter
from nibble.transport.stream.base import StreamEntry, TrajectoryReader, TrajectoryWriter
from nibble.transport.stream.connection import RedisUnavailable, connect, read_password, retrying
from nibble.transport.stream.redis_stream import RedisTrajectoryReader, RedisTrajectoryWriter, undelivered
from nibble.transport.stream.validate import reason_code, validate_group

__all__ = [
    "AdmissionCounter",
    "RedisTrajectoryReader",
    "RedisTrajectoryWriter",
    "RedisUnavailable",
    "StreamEntry",
    "TrajectoryReader",
    "TrajectoryWriter",
    "connect",
    "read_password",
    "reason_code",
    "retrying",
    "undelivered",
    "validate_group",
]
