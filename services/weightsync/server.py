"""Weight-sync's gRPC servers (docs/design.md §5).

The publish port serves ``WeightPublisher`` (and ``WeightSync.GetVersion``, so a resumed trainer can
continue above the newest version) under the publish token; the sampler port serves ``WeightSync``
under the fetch token. A publication is verified in full, quantised once under the plan it carries,
persisted, and only then announced; watchers are woken by one condition variable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pydantic
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nibble.config import WeightSyncConfig
from nibble.monitoring.metrics import Metrics
from nibble.recipe.export import quantize_state
from nibble.recipe.plan import PrecisionPlan
from nibble.transport.weights.assembler import WeightAssembler, WeightRejected
from nibble.transport.weights.auth import FETCH_TOKEN_ENV, PUBLISH_TOKEN_ENV, BearerTokenInterceptor, read_token
from nibble.transport.weights.frames import ChunkFrame, pass_frames, read_frame
from nibble.transport.weights.grpc_util import add_port, server_options
from nibble.transport.weights.payload import dtype_name
from nibble.weightsync import quality
from nibble.weightsync.export import VersionExporter
from nibble.weightsync.store import WeightStore
from nibble.wire import pb, rpc

log = logging.getLogger(__name__)

_STATUS = {
    "stale_version": grpc.StatusCode.FAILED_PRECONDITION,
    "bad_checksum": grpc.StatusCode.DATA_LOSS,
    "digest_mismatch": grpc.StatusCode.DATA_LOSS,
}
"""Status of a rejected publication by reason; every other reason is ``INVALID_ARGUMENT``."""

WAKE_SECONDS = 1.0
"""A watcher re-checks whether its caller is still there at least this often (seconds)."""


class WeightSync:
    """The service's state and logic, shared by the servicers: store, metrics, watchers."""

    def __init__(self, config: WeightSyncConfig, metrics: Metrics):
        self.config = config
        self.metrics = metrics
        self.store = WeightStore(config.store_dir, config.keep_versions)
        self.exporter = VersionExporter(config) if config.export_format != "none" else None
        self._set_version()
        self._changed = threading.Condition()
        self._closing = False
        self._publish_lock = threading.Lock()
        self._receive_buffer: torch.Tensor | None = None  # the last publication's, reused by the next
        self._receive_lock = threading.Lock()

    def publish(self, items: Iterator[pb.WeightStreamItem | ChunkFrame]) -> pb.PublishReply:
        """Verify, quantise, persist, announce one publication; then measure the quantisation's quality
        (off the samplers' path, before the trainer's reply).

        Publications are received into one buffer kept from the last (fresh memory's page faults cost
        more than receiving it); one that overlaps another receives into fresh memory instead.

        Raises:
            WeightRejected: anything that fails; nothing of it is stored or announced.
        """
        reuse = self._receive_lock.acquire(blocking=False)
        assembler = WeightAssembler(
            max_bytes=self.config.max_payload_bytes,
            quantized=False,
            buffer=self._receive_buffer if reuse else None,
        )
        try:
            return self._publish(items, assembler)
        finally:
            if reuse:
                self._receive_buffer = assembler.buffer  # no tensor of this publication is used any more
                self._receive_lock.release()

    def _publish(
        self, items: Iterator[pb.WeightStreamItem | ChunkFrame], assembler: WeightAssembler
    ) -> pb.PublishReply:
        try:
            manifest, tensors, plan = self._receive(items, assembler)
            received = time.time()
            try:
                quantized = quantize_state(tensors, plan)
            except ValueError as exc:
                raise WeightRejected("bad_tensor", str(exc)) from None
            quantized_at = time.time()
            with self._publish_lock:
                self._check_newer(manifest.policy_version)
                self._check_layout(manifest.policy_version, quantized)
                self._export(manifest.policy_version, quantized, plan)
                stored = self.store.put(
                    manifest.policy_version,
                    quantized,
                    plan=manifest.plan,
                    published_at=received,
                    chunk_bytes=self.config.chunk_bytes,
                )
        except WeightRejected as exc:
            self.metrics.rejected.labels(reason=exc.reason).inc()
            log.warning("publication rejected: %s", exc)
            raise
        self._set_version()
        with self._changed:
            self._changed.notify_all()
        log.info(
            "version %d announced: %d bytes published, %d served; quantised in %.2f s, stored in %.2f s",
            stored.version, manifest.total_bytes, stored.manifest.total_bytes,
            quantized_at - received, time.time() - quantized_at,
        )  # fmt: skip
        measured = quality.measure(tensors, quantized, plan)
        for layer, value in measured.rel_error.items():
            self.metrics.quant_rel_error.labels(layer=layer).set(value)
        self.metrics.four_over_six_fraction.set(measured.four_over_six_fraction)
        return pb.PublishReply(policy_version=stored.version, bytes_received=manifest.total_bytes)

    def _export(self, version: int, quantized: dict[str, torch.Tensor], plan: PrecisionPlan) -> None:
        """Write the version's checkpoint directory before it is stored and announced (a failure rejects
        the publication: an engine told of a version must find it on disk)."""
        if self.exporter is None:
            return
        try:
            self.exporter.write(version, quantized, plan)
        except (OSError, ValueError) as exc:
            raise WeightRejected("export_failed", f"writing the {self.config.export_format} export: {exc}") from None

    def _receive(
        self, items: Iterator[pb.WeightStreamItem | ChunkFrame], assembler: WeightAssembler
    ) -> tuple[pb.WeightManifest, dict[str, object], PrecisionPlan]:
        """Assemble the bf16 publication; a stale version or a bad plan fails before the chunks arrive."""
        items = iter(items)
        try:
            first = next(items, None)
            if first is None:
                raise WeightRejected("no_manifest", "the publication stream was empty")
            assembler.add(first)
            assert assembler.manifest is not None
            self._check_newer(assembler.manifest.policy_version)
            plan = _parse_plan(assembler.manifest.plan)
            for item in items:
                assembler.add(item)
            manifest, tensors = assembler.result()
        finally:
            self._count_bytes(assembler.received_bytes)
        return manifest, tensors, plan

    def _check_newer(self, version: int) -> None:
        latest = self.store.latest()
        if version <= latest:
            raise WeightRejected(
                "stale_version", f"version {version} is not above the newest held ({latest}); versions only increase"
            )

    def _check_layout(self, version: int, quantized: dict[str, torch.Tensor]) -> None:
        """The tensors (names, dtypes, shapes) must be those of the newest version held: samplers hold a
        model of one layout, so a version with an unknown, missing or reshaped tensor could never be
        applied and is not announced. The first version held sets the layout."""
        newest = self.store.newest()
        if newest is None:
            return
        held = {m.name: (m.dtype, tuple(m.shape)) for m in newest.manifest.tensors}
        got = {name: (dtype_name(t.dtype), tuple(t.shape)) for name, t in quantized.items()}
        if got == held:
            return
        unknown, missing = sorted(set(got) - set(held)), sorted(set(held) - set(got))
        changed = sorted(n for n in set(got) & set(held) if got[n] != held[n])
        raise WeightRejected(
            "layout_mismatch",
            f"version {version} does not match the layout of version {newest.version}: unknown tensors "
            f"{unknown[:4]}, missing {missing[:4]}, other dtype or shape {changed[:4]} (a new model needs a new store)",
        )

    def watch(self, after_version: int, context: grpc.ServicerContext) -> Iterator[pb.VersionAnnouncement]:
        """Announcements of held versions above ``after_version``, then of each new one, until the
        caller leaves or the service closes."""
        last = after_version
        context.add_callback(self.wake)
        while context.is_active():
            with self._changed:
                pending = [a for a in self.store.announcements() if a.policy_version > last]
                if not pending:
                    if self._closing:
                        return
                    self._changed.wait(WAKE_SECONDS)
                    continue
            for announcement in pending:
                yield announcement
                last = announcement.policy_version

    def fetch(self, version: int) -> Iterator[bytes]:
        """The stream of a held version, as serialised messages (manifest first).

        Raises:
            KeyError: ``version`` is not held.
        """
        frames = self.store.open_stream(version)
        yield next(frames)
        for frame in frames:
            yield frame
            self._count_bytes(len(frame))

    def versions(self) -> pb.GetVersionReply:
        held = self.store.versions()
        return pb.GetVersionReply(latest_version=max(held, default=0), available_versions=held)

    def _set_version(self) -> None:
        self.metrics.policy_version.labels(role=self.metrics.role).set(self.store.latest())

    def _count_bytes(self, nbytes: int) -> None:
        """``nibble_weight_bytes_total``: chunk data received from the trainer and chunk messages served."""
        self.metrics.weight_bytes.labels(role=self.metrics.role).inc(nbytes)

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def close(self) -> None:
        """Let every watch end (its stream finishes cleanly; subscribers reconnect elsewhere or later)."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()


def _parse_plan(plan_json: str) -> PrecisionPlan:
    try:
        return PrecisionPlan.model_validate_json(plan_json)
    except pydantic.ValidationError as exc:
        raise WeightRejected("bad_plan", f"the manifest's plan is not a valid PrecisionPlan ({exc})") from None


class PublisherServicer(rpc.WeightPublisherServicer):
    def __init__(self, sync: WeightSync):
        self.sync = sync

    def PublishWeights(self, request_iterator, context):
        try:
            return self.sync.publish(request_iterator)
        except WeightRejected as exc:
            context.abort(_STATUS.get(exc.reason, grpc.StatusCode.INVALID_ARGUMENT), str(exc))
        except OSError as exc:  # the store could not write (disk full, permissions): nothing was announced
            log.error("storing a publication failed: %s", exc)
            context.abort(grpc.StatusCode.INTERNAL, f"weight-sync could not store the version: {exc.strerror}")


class SyncServicer(rpc.WeightSyncServicer):
    """``WeightSync`` for samplers; with ``versions_only`` (the publish port) it answers only GetVersion."""

    def __init__(self, sync: WeightSync, *, versions_only: bool = False):
        self.sync = sync
        self.versions_only = versions_only

    def WatchVersions(self, request, context):
        self._check_allowed(context)
        yield from self.sync.watch(request.after_version, context)

    def FetchWeights(self, request, context):
        self._check_allowed(context)
        try:
            items = self.sync.fetch(request.policy_version)
            first = next(items)  # opens the version now, so NOT_FOUND is a status, not a broken stream
        except KeyError:
            held = self.sync.store.versions()
            context.abort(grpc.StatusCode.NOT_FOUND, f"version {request.policy_version} is not held (held: {held})")
        yield first
        yield from items

    def GetVersion(self, request, context):
        return self.sync.versions()

    def _check_allowed(self, context) -> None:
        if self.versions_only:
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "the publish port answers only GetVersion; use the sampler port"
            )


class WeightSyncServer:
    """The running service: both gRPC servers with health checking, and ``/metrics``.

    Ports (``publish_port``, ``port``, ``metrics_port``) are the bound ones once :meth:`start` returns.

    Args:
        config: the ``weightsync`` section.
        environ: where ``NIBBLE_PUBLISH_TOKEN``/``NIBBLE_FETCH_TOKEN`` are looked up (default ``os.environ``).
    Raises:
        ValueError: an unreadable token file.
    """

    def __init__(self, config: WeightSyncConfig, environ: dict[str, str] | None = None):
        self.config = config
        self.metrics = Metrics("weightsync")
        self.sync = WeightSync(config, self.metrics)
        self._tokens = {
            "publish": read_token(config.publish_token_file, PUBLISH_TOKEN_ENV, environ),
            "fetch": read_token(config.fetch_token_file, FETCH_TOKEN_ENV, environ),
        }
        self._health = health.HealthServicer(experimental_non_blocking=True)
        self._servers: list[grpc.Server] = []
        self._http = None
        self.publish_port = self.port = self.metrics_port = 0

    def start(self) -> None:
        """Bind and start everything; raises ValueError when a port cannot be bound."""
        c = self.config
        publish = self._server("publish")
        _add_weight_publisher(PublisherServicer(self.sync), publish)
        rpc.add_WeightSyncServicer_to_server(SyncServicer(self.sync, versions_only=True), publish)
        samplers = self._server("fetch")
        _add_weight_sync(SyncServicer(self.sync), samplers)
        tls = {"cert_file": c.tls_cert_file, "key_file": c.tls_key_file, "client_ca_file": c.tls_client_ca_file}
        self.publish_port = add_port(publish, _address(c.host, c.publish_port), **tls)
        self.port = add_port(samplers, _address(c.host, c.port), **tls)
        for server in self._servers:
            server.start()
        for service in ("", "nibble.wire.WeightPublisher", "nibble.wire.WeightSync"):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._http = self.metrics.serve(c.metrics_port, c.host, keys=("weightsync.host", "weightsync.metrics_port"))
        self.metrics_port = self._http.server_port

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, end the watches, give in-flight RPCs ``grace`` seconds, stop."""
        grace = self.config.shutdown_grace_seconds if grace is None else grace
        self._health.enter_graceful_shutdown()
        self.sync.close()
        for done in [server.stop(grace) for server in self._servers]:
            done.wait()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def _server(self, name: str) -> grpc.Server:
        token = self._tokens[name]
        interceptors = []
        if token is None:
            log.warning("weightsync: no %s token configured; the %s port accepts every caller", name, name)
        else:
            interceptors.append(
                BearerTokenInterceptor(
                    token, on_reject=lambda _method: self.metrics.rejected.labels(reason="bad_token").inc()
                )
            )
        pool = ThreadPoolExecutor(self.config.server_threads, thread_name_prefix=f"weightsync-{name}")
        # no SO_REUSEPORT (gRPC sets it by default on Linux): a second server started on this port must fail to
        # bind it, not share it and take half of the connections (as the health server does too)
        options = [*server_options(), ("grpc.so_reuseport", 0)]
        server = grpc.server(pool, interceptors=interceptors, options=options)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self._servers.append(server)
        return server


def _add_weight_publisher(servicer: PublisherServicer, server: grpc.Server) -> None:
    """The generated ``add_WeightPublisherServicer_to_server``, except that chunks arrive as views into
    the received messages (:func:`read_frame`), not as copies."""
    handlers = {
        "PublishWeights": grpc.stream_unary_rpc_method_handler(
            servicer.PublishWeights,
            request_deserializer=read_frame,
            response_serializer=pb.PublishReply.SerializeToString,
        ),
    }
    server.add_registered_method_handlers(pb.DESCRIPTOR.services_by_name["WeightPublisher"].full_name, handlers)


def _add_weight_sync(servicer: SyncServicer, server: grpc.Server) -> None:
    """The generated ``add_WeightSyncServicer_to_server``, except that FetchWeights sends the chunk
    messages as the store holds them, already serialised (one read per chunk, no re-encoding)."""
    handlers = {
        "WatchVersions": grpc.unary_stream_rpc_method_handler(
            servicer.WatchVersions,
            request_deserializer=pb.WatchRequest.FromString,
            response_serializer=pb.VersionAnnouncement.SerializeToString,
        ),
        "FetchWeights": grpc.unary_stream_rpc_method_handler(
            servicer.FetchWeights, request_deserializer=pb.FetchRequest.FromString, response_serializer=pass_frames
        ),
        "GetVersion": grpc.unary_unary_rpc_method_handler(
            servicer.GetVersion,
            request_deserializer=pb.GetVersionRequest.FromString,
            response_serializer=pb.GetVersionReply.SerializeToString,
        ),
    }
    server.add_registered_method_handlers(pb.DESCRIPTOR.services_by_name["WeightSync"].full_name, handlers)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
