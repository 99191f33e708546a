"""What both gRPC ends of weight transport share (docs/design.md §5): a channel, its bearer token and the retry
policy, under the trainer's :class:`~nibble.transport.weights.publisher.GrpcWeightPublisher` and the
sampler's :class:`~nibble.transport.weights.subscriber.GrpcWeightSubscriber`.

Every call carries a bearer token and a deadline; long streams also have a per-message deadline
(``rpc_timeout``), so a stalled peer is noticed in seconds rather than at the end of the whole
stream's deadline. Calls that fail with a retryable status are retried after a bounded backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc

from nibble.transport.weights.auth import bearer_metadata
from nibble.transport.weights.grpc_util import RETRYABLE, Backoff, open_channel
from nibble.wire import pb, rpc

log = logging.getLogger(__name__)
T = TypeVar("T")


class StreamStalled(Exception):
    """A weight stream moved no message for ``rpc_timeout`` seconds and was cancelled."""


class GrpcClient:
    """A channel, its token and the retry policy shared by both ends."""

    def __init__(
        self,
        target: str,
        token: str | None,
        *,
        ca_file: Path | None,
        rpc_timeout: float,
        stream_timeout: float,
        attempts: int,
        cert_file: Path | None = None,
        key_file: Path | None = None,
    ):
        if attempts < 1:
            raise ValueError(f"attempts={attempts} must be at least 1")
        self.target = target
        self.rpc_timeout = rpc_timeout
        self.stream_timeout = stream_timeout
        self.attempts = attempts
        self._metadata = bearer_metadata(token)
        self._channel = open_channel(target, ca_file=ca_file, cert_file=cert_file, key_file=key_file)
        self._sync = rpc.WeightSyncStub(self._channel)
        self._closed = threading.Event()

    def latest_version(self) -> int:
        """The newest version weight-sync holds (0 when none)."""
        return self.versions().latest_version

    def versions(self) -> pb.GetVersionReply:
        """The newest and every held version."""
        call = self._sync.GetVersion
        return self._retrying(lambda: call(pb.GetVersionRequest(), timeout=self.rpc_timeout, metadata=self._metadata))

    def close(self) -> None:
        """Close the channel; calls in flight fail and a running ``GrpcWeightSubscriber.watch`` returns."""
        self._closed.set()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _retrying(self, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` up to ``attempts`` times while it fails with a retryable status or stalls."""
        backoff = Backoff()
        for number in range(1, self.attempts + 1):
            try:
                return attempt()
            except (grpc.RpcError, StreamStalled) as exc:
                code = exc.code() if isinstance(exc, grpc.RpcError) else None
                if number == self.attempts or (code is not None and code not in RETRYABLE) or self._closed.is_set():
                    raise
                log.warning("%s: attempt %d failed (%s); retrying", self.target, number, code or exc)
                if not backoff.wait(self._closed):
                    raise
        raise AssertionError("unreachable")
