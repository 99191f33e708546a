"""Weight transfer (trainer → weight-sync → samplers, docs/design.md §5): the :class:`WeightPublisher` and
:class:`WeightSubscriber` interfaces, their gRPC implementation, the chunked payload format and its
verifying assembler, bearer tokens and TLS."""

from nibble.transport.weights.assembler import WeightAssembler, WeightRejected
from nibble.transport.weights.auth import BearerTokenInterceptor, bearer_metadata, read_token
from nibble.transport.weights.base import FetchFailed, VersionUnavailable, WeightPublisher, WeightSubscriber
from nibble.transport.weights.client import StreamStalled
from nibble.transport.weights.payload import stream_items
from nibble.transport.weights.publisher import GrpcWeightPublisher, publisher_from_config
from nibble.transport.weights.subscriber import GrpcWeightSubscriber, subscriber_from_config

__all__ = [
    "BearerTokenInterceptor",
    "FetchFailed",
    "GrpcWeightPublisher",
    "GrpcWeightSubscriber",
    "StreamStalled",
    "VersionUnavailable",
    "WeightAssembler",
    "WeightPublisher",
    "WeightRejected",
    "WeightSubscriber",
    "bearer_metadata",
    "publisher_from_config",
    "read_token",
    "stream_items",
    "subscriber_from_config",
]
