"""Transports between the services (DESIGN.md §1): weight chunking and checksums, gRPC plumbing, tokens."""

from nibble.transport.auth import BearerTokenInterceptor, bearer_metadata, read_token
from nibble.transport.weights import WeightAssembler, WeightRejected, stream_items
from nibble.transport.weights_client import StreamStalled, WeightPublisherClient, WeightSubscriber

__all__ = [
    "BearerTokenInterceptor",
    "StreamStalled",
    "WeightAssembler",
    "WeightPublisherClient",
    "WeightRejected",
    "WeightSubscriber",
    "bearer_metadata",
    "read_token",
    "stream_items",
]
