"""gRPC health checking (``grpc.health.v1.Health``) for services that have no gRPC server of their own.

The trainer and the samplers serve only this, on their ``health_port``, so that container runtimes and
Kubernetes probe every Nibble service the same way (weight-sync serves health on its own ports). The
status is NOT_SERVING until the service has loaded its model and connected, SERVING while it works,
and NOT_SERVING again once it begins to stop.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nibble.transport.weights.grpc_util import add_port


class HealthServer:
    """A gRPC server holding only the health service (the overall status, service name ``""``).

    Args:
        host: the address to bind (``0.0.0.0`` or ``::`` in a container, ``127.0.0.1`` locally).
        port: the TCP port; ``port`` is the bound one once :meth:`start` returns.
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._servicer = health.HealthServicer(experimental_non_blocking=True)
        self._servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        # no SO_REUSEPORT: a second process on the same port must fail, not share the probes
        self._server = grpc.server(
            ThreadPoolExecutor(2, thread_name_prefix="health"), options=[("grpc.so_reuseport", 0)]
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, self._server)

    def start(self) -> HealthServer:
        """Bind and serve (still NOT_SERVING). Raises ValueError when the port cannot be bound."""
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        self.port = add_port(self._server, address)
        self._server.start()
        return self

    def serving(self) -> None:
        """Report SERVING: the service is ready to work."""
        self._servicer.set("", health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float = 1.0) -> None:
        """Report NOT_SERVING to every watcher, then stop the server."""
        self._servicer.enter_graceful_shutdown()
        self._server.stop(grace).wait()


def start_health(host: str, port: int | None) -> HealthServer | None:
    """A started :class:`HealthServer` on ``host:port`` (NOT_SERVING until told), or None when ``port`` is None.

    Raises:
        ValueError: the port cannot be bound.
    """
    return None if port is None else HealthServer(host, port).start()
