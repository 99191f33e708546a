"""Transports between the services (docs/design.md §1, §5): the trajectory stream on Redis with admission
control (sampler → trainer), and weight chunking, checksums, tokens and gRPC clients (trainer →
weight-sync → samplers)."""

from nibble.transport.admission import AdmissionCounter, allowed_groups
from nibble.transport.auth import BearerTokenInterceptor, bearer_metadata, read_token
from nibble.transport.connection import RedisUnavailable, connect, read_password, retrying
from nibble.transport.stream import StreamEntry, TrajectoryReader, TrajectoryWriter, undelivered
from nibble.transport.validate import REASONS, reason_code, validate_group
from nibble.transport.weights import WeightAssembler, WeightRejected, stream_items
from nibble.transport.weights_client import (
    StreamStalled,
    WeightPublisherClient,
    WeightSubscriber,
    publisher_from_config,
    subscriber_from_config,
)

__all__ = [
    "REASONS",
    "AdmissionCounter",
    "BearerTokenInterceptor",
    "RedisUnavailable",
    "StreamEntry",
    "StreamStalled",
    "TrajectoryReader",
    "TrajectoryWriter",
    "WeightAssembler",
    "WeightPublisherClient",
    "WeightRejected",
    "WeightSubscriber",
    "allowed_groups",
    "bearer_metadata",
    "connect",
    "publisher_from_config",
    "read_password",
    "read_token",
    "reason_code",
    "retrying",
    "stream_items",
    "subscriber_from_config",
    "undelivered",
    "validate_group",
]
