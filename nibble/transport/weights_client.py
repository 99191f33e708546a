"""The two ends of weight transport (docs/design.md §5): the trainer's :class:`WeightPublisherClient` and the
sampler's :class:`WeightSubscriber`, both talking to the weight-sync service over gRPC.

Every call carries a bearer token and a deadline; long streams also have a per-message deadline
(``rpc_timeout``), so a stalled peer is noticed in seconds rather than at the end of the whole
stream's deadline. Calls that fail with a retryable status are retried after a bounded backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
import torch

from nibble.config import WeightSyncConfig
from nibble.transport.auth import FETCH_TOKEN_ENV, PUBLISH_TOKEN_ENV, bearer_metadata, read_token
from nibble.transport.frames import pass_frames, read_frame
from nibble.transport.grpc_util import RETRYABLE, Backoff, StallWatchdog, open_channel
from nibble.transport.weights import DEFAULT_MAX_PAYLOAD_BYTES, MAX_CHUNK_BYTES, WeightAssembler, layout, stream_frames
from nibble.wire import pb, rpc

if TYPE_CHECKING:
    from nibble.recipe.plan import PrecisionPlan

log = logging.getLogger(__name__)
T = TypeVar("T")


class StreamStalled(Exception):
    """A weight stream moved no message for ``rpc_timeout`` seconds and was cancelled."""


class _Client:
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
        """Close the channel; calls in flight fail and a running :meth:`WeightSubscriber.watch` returns."""
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


class WeightPublisherClient(_Client):
    """The trainer's side: publishes each version (bf16, as ``published_state`` gives it) to weight-sync's
    publish port, which also answers ``GetVersion`` so a resumed trainer can continue above it.

    Args:
        target: ``host:port`` of weight-sync's publish port.
        token: the publish token (``None``: the server runs without auth).
        ca_file: CA certificate to verify the server's TLS certificate; plaintext when ``None``.
        cert_file, key_file: this client's own certificate and key, for a server that requires mutual TLS.
        chunk_bytes: chunk size (bytes), at most 4 MiB.
        rpc_timeout: deadline of unary calls and of each chunk of a stream (seconds).
        stream_timeout: deadline of a whole publication, quantisation on the server included (seconds).
        attempts: tries per call while the server is unavailable.
    """

    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        chunk_bytes: int = MAX_CHUNK_BYTES,
        rpc_timeout: float = 60.0,
        stream_timeout: float = 3600.0,
        attempts: int = 3,
    ):
        super().__init__(
            target, token, ca_file=ca_file, rpc_timeout=rpc_timeout, stream_timeout=stream_timeout, attempts=attempts,
            cert_file=cert_file, key_file=key_file,
        )  # fmt: skip
        self.chunk_bytes = chunk_bytes
        self._publish = self._channel.stream_unary(  # the generated stub, but sending pre-serialised frames
            f"/{pb.DESCRIPTOR.services_by_name['WeightPublisher'].full_name}/PublishWeights",
            request_serializer=pass_frames,
            response_deserializer=pb.PublishReply.FromString,
        )

    def publish(self, version: int, state: dict[str, torch.Tensor], plan: PrecisionPlan) -> pb.PublishReply:
        """Stream ``state`` as ``version`` and wait until weight-sync has verified, quantised and stored it.

        A publication whose reply was lost and that is retried answers ``FAILED_PRECONDITION`` (the
        version is held already); :meth:`latest_version` tells the two cases apart.

        Raises:
            ValueError: a tensor of a dtype weights cannot travel as.
            grpc.RpcError: ``FAILED_PRECONDITION`` for a version not above the latest held,
                ``INVALID_ARGUMENT``/``DATA_LOSS`` for a rejected publication, ``UNAUTHENTICATED``, or
                ``UNAVAILABLE`` once the attempts are spent.
            StreamStalled: the server accepted no chunk for ``rpc_timeout`` seconds, on every attempt.
        """
        state = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
        layout(state)  # an unsupported dtype fails here, naming the tensor, not inside gRPC's sending thread
        plan_json = plan.model_dump_json()
        return self._retrying(lambda: self._publish_once(version, state, plan_json))

    def _publish_once(self, version: int, state: dict[str, torch.Tensor], plan_json: str) -> pb.PublishReply:
        calls: list[grpc.Future] = []
        watchdog = StallWatchdog(self.rpc_timeout, lambda: calls[0].cancel())

        def frames() -> Iterator[bytes]:
            for index, frame in enumerate(stream_frames(version, state, plan_json, chunk_bytes=self.chunk_bytes)):
                if index == 0:
                    watchdog.start()  # armed once the manifest (hashing the whole payload first) is ready
                yield frame
                watchdog.progress()  # the previous item was taken: flow control let it through
            watchdog.stop()  # the server now verifies and quantises: only the whole-call deadline applies

        calls.append(self._publish.future(frames(), timeout=self.stream_timeout, metadata=self._metadata))
        try:
            return calls[0].result()
        except grpc.FutureCancelledError:
            raise StreamStalled(f"publishing version {version}: no chunk taken for {self.rpc_timeout} s") from None
        finally:
            watchdog.stop()


class WeightSubscriber(_Client):
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
            grpc.RpcError: ``NOT_FOUND`` for a version not held, ``UNAUTHENTICATED``, or ``UNAVAILABLE``
                once the attempts are spent.
            StreamStalled: no chunk arrived for ``rpc_timeout`` seconds, on every attempt.
        """
        with self._fetch_lock:
            return self._retrying(lambda: self._fetch_once(version))

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


def publisher_from_config(config: WeightSyncConfig) -> WeightPublisherClient:
    """The trainer's client for a ``weightsync`` config section (publish token from file or env)."""
    return WeightPublisherClient(
        f"{config.host}:{config.publish_port}",
        read_token(config.publish_token_file, PUBLISH_TOKEN_ENV),
        ca_file=config.tls_ca_file,
        cert_file=config.tls_client_cert_file,
        key_file=config.tls_client_key_file,
        chunk_bytes=config.chunk_bytes,
        rpc_timeout=config.rpc_timeout_seconds,
    )


def subscriber_from_config(config: WeightSyncConfig, sampler_id: str) -> WeightSubscriber:
    """A sampler's client for a ``weightsync`` config section (fetch token from file or env)."""
    return WeightSubscriber(
        f"{config.host}:{config.port}",
        read_token(config.fetch_token_file, FETCH_TOKEN_ENV),
        sampler_id=sampler_id,
        ca_file=config.tls_ca_file,
        cert_file=config.tls_client_cert_file,
        key_file=config.tls_client_key_file,
        rpc_timeout=config.rpc_timeout_seconds,
        max_bytes=config.max_payload_bytes,
    )
