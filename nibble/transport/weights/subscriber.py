"""The sampler's end of weight transport over gRPC (docs/design.md §5): watches weight-sync for new versions and
fetches them, verified. Deadlines, tokens and retries are :class:`~nibble.transport.weights.client.GrpcClient`'s."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import torch

from nibble.config import WeightSyncConfig
from nibble.transport.weights.assembler import WeightAssembler
from nibble.transport.weights.auth import FETCH_TOKEN_ENV, read_token
from nibble.transport.weights.base import FetchFailed, VersionUnavailable
from nibble.transport.weights.client import GrpcClient, StreamStalled
from nibble.transport.weights.frames import read_frame
from nibble.transport.weights.grpc_util import RETRYABLE, Backoff, StallWatchdog
from nibble.transport.weights.payload import DEFAULT_MAX_PAYLOAD_BYTES
from nibble.wire import pb

log = logging.getLogger(__name__)


class GrpcWeightSubscriber(GrpcClient):
    """The sampler's side: learns of new versions and fetches them, verified.

    Args:
        target: ``host:port`` of weight-sync's sampler port.
        token: the fetch token (``None``: the server runs without auth).
        sampler_id: this sampler's name, for the server's logs.
        ca_file: CA certificate to verify the server's TLS certificate; plaintext when ``None``.
        cert_file, key_file: this client's own certificate and key, for a server that requires mutual TLS.
        rpc_timeout: deadline of unary calls and of each chunk of a fetch (seconds).
        stream_timeout: deadline of a whole fetch (seconds).
        watch_timeout: a watch call is re-opened after this long (seconds), so a silently dead
            connection costs at most this much.
        max_bytes: largest payload accepted (bytes).
        attempts: tries per fetch while the server is unavailable (watching retries forever).
    """

    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        sampler_id: str = "",
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        rpc_timeout: float = 60.0,
        stream_timeout: float = 3600.0,
        watch_timeout: float = 300.0,
        max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        attempts: int = 3,
    ):
        super().__init__(
            target, token, ca_file=ca_file, rpc_timeout=rpc_timeout, stream_timeout=stream_timeout, attempts=attempts,
            cert_file=cert_file, key_file=key_file,
        )  # fmt: skip
        self.sampler_id = sampler_id
        self.watch_timeout = watch_timeout
        self.max_bytes = max_bytes
        self._receive_buffer: torch.Tensor | None = None  # reused by every fetch (see fetch)
        self._fetch_lock = threading.Lock()
        self._fetch = self._channel.unary_stream(  # the generated stub, but chunks arrive as views, not copies
            f"/{pb.DESCRIPTOR.services_by_name['WeightSync'].full_name}/FetchWeights",
            request_serializer=pb.FetchRequest.SerializeToString,
            response_deserializer=read_frame,
        )

    def watch(self, after_version: int = 0) -> Iterator[pb.VersionAnnouncement]:
        """Announcements of complete versions above ``after_version``, each once and in increasing order,
        across reconnects (bounded backoff while the server is away). Ends when :meth:`close` is called.

        Raises:
            grpc.RpcError: a status that retrying cannot fix (``UNAUTHENTICATED``, ``INVALID_ARGUMENT``, …).
        """
        last = after_version
        backoff = Backoff()
        while not self._closed.is_set():
            request = pb.WatchRequest(after_version=last, sampler_id=self.sampler_id)
            call = self._sync.WatchVersions(request, timeout=self.watch_timeout, metadata=self._metadata)
            try:
                for announcement in call:
                    backoff.reset()
                    if announcement.policy_version > last:
                        last = announcement.policy_version
                        yield announcement
            except grpc.RpcError as exc:
                code = exc.code()
                if self._closed.is_set():
                    return
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    continue  # the periodic re-open
                if code not in RETRYABLE and code != grpc.StatusCode.CANCELLED:
                    raise
                log.warning("%s: watch interrupted (%s); reconnecting", self.target, code)
            finally:
                call.cancel()
            if not backoff.wait(self._closed):
                return

    def fetch(self, version: int) -> tuple[pb.WeightManifest, dict[str, torch.Tensor]]:
        """The verified manifest and tensors (weight-sync's quantised form) of ``version``.

        The tensors are views of one receive buffer that this subscriber keeps and the next fetch
        overwrites: copy what must outlive it (``Engine.update_weights`` does). Reusing it spares each
        fetch the page faults of fresh memory, which cost more than the transfer. Fetches from several
        threads run one at a time.

        Raises:
            WeightRejected: the stream failed verification (nothing of it may be applied).
            VersionUnavailable: weight-sync answered ``NOT_FOUND`` (the version is not held).
            FetchFailed: any other status once the attempts are spent (``UNAVAILABLE``, ``UNAUTHENTICATED``,
                …), or no chunk for ``rpc_timeout`` seconds on every attempt; the gRPC error is its cause.
        """
        with self._fetch_lock:
            try:
                return self._retrying(lambda: self._fetch_once(version))
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                details = exc.details() if hasattr(exc, "details") else str(exc)
                if code == grpc.StatusCode.NOT_FOUND:
                    raise VersionUnavailable(f"version {version}: {details}") from exc
                raise FetchFailed(f"fetching version {version}: {getattr(code, 'name', code)}: {details}") from exc
            except StreamStalled as exc:
                raise FetchFailed(str(exc)) from exc

    def _fetch_once(self, version: int) -> tuple[pb.WeightManifest, dict[str, torch.Tensor]]:
        request = pb.FetchRequest(policy_version=version, sampler_id=self.sampler_id)
        call = self._fetch(request, timeout=self.stream_timeout, metadata=self._metadata)
        assembler = WeightAssembler(
            max_bytes=self.max_bytes, version=version, quantized=True, buffer=self._receive_buffer
        )
        with StallWatchdog(self.rpc_timeout, call.cancel) as watchdog:
            try:
                for item in call:
                    watchdog.progress()
                    assembler.add(item)
            except grpc.RpcError:
                if watchdog.stalled:
                    raise StreamStalled(f"fetching version {version}: no chunk for {self.rpc_timeout} s") from None
                raise
            finally:
                call.cancel()
                self._receive_buffer = assembler.buffer  # grown or not, kept even when the stream failed
        return assembler.result()


def subscriber_from_config(config: WeightSyncConfig, sampler_id: str) -> GrpcWeightSubscriber:
    """A sampler's client for a ``weightsync`` config section (fetch token from file or env)."""
    return GrpcWeightSubscriber(
        f"{config.host}:{config.port}",
        read_token(config.fetch_token_file, FETCH_TOKEN_ENV),
        sampler_id=sampler_id,
        ca_file=config.tls_ca_file,
        cert_file=config.tls_client_cert_file,
        key_file=config.tls_client_key_file,
        rpc_timeout=config.rpc_timeout_seconds,
        max_bytes=config.max_payload_bytes,
    )
