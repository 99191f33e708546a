"""The trainer's end of weight transport over gRPC (docs/design.md §5): publishes each version to weight-sync.
Deadlines, tokens and retries are :class:`~nibble.transport.weights.client.GrpcClient`'s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import torch

from nibble.config import WeightSyncConfig
from nibble.transport.weights.auth import PUBLISH_TOKEN_ENV, read_token
from nibble.transport.weights.client import GrpcClient, StreamStalled
from nibble.transport.weights.frames import pass_frames
from nibble.transport.weights.grpc_util import StallWatchdog
from nibble.transport.weights.payload import MAX_CHUNK_BYTES, layout, stream_frames
from nibble.wire import pb

if TYPE_CHECKING:
    from nibble.recipe.plan import PrecisionPlan


class GrpcWeightPublisher(GrpcClient):
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


def publisher_from_config(config: WeightSyncConfig) -> GrpcWeightPublisher:
    """The trainer's client for a ``weightsync`` config section (publish token from file or env)."""
    return GrpcWeightPublisher(
        f"{config.host}:{config.publish_port}",
        read_token(config.publish_token_file, PUBLISH_TOKEN_ENV),
        ca_file=config.tls_ca_file,
        cert_file=config.tls_client_cert_file,
        key_file=config.tls_client_key_file,
        chunk_bytes=config.chunk_bytes,
        rpc_timeout=config.rpc_timeout_seconds,
    )
