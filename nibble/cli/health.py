"""``nibble health HOST:PORT``: ask a service's gRPC health checking (the images' HEALTHCHECK)."""

from __future__ import annotations

from typing import Annotated

import typer

from nibble.cli.app import app


@app.command("health")
def health(
    address: Annotated[
        str, typer.Argument(help="HOST:PORT of the service's health port (weight-sync: its fetch port)")
    ],
    service: Annotated[str, typer.Option(help="service name to ask about; '' is the whole server")] = "",
    timeout: Annotated[float, typer.Option(help="seconds to wait for the answer")] = 3.0,
) -> None:
    """Exit 0 when the service answers SERVING, 1 otherwise (unreachable, NOT_SERVING, unknown service)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            typer.echo(f"{address}: {exc.code().name} ({exc.details()})", err=True)
            raise typer.Exit(1) from None
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    typer.echo(f"{address}: {status}")
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise typer.Exit(1)
