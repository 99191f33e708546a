"""``nibble health``: ask a service's gRPC health checking (the images' HEALTHCHECK)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from nibble.cli.app import app, user_errors


class Role(str, Enum):
    weightsync = "weightsync"
    trainer = "trainer"
    sampler = "sampler"


def local_address(config_file: Path, role: Role) -> str:
    """``127.0.0.1:PORT`` of ``role``'s health port in the run config (``NIBBLE_*`` overrides applied, as
    the service itself reads it): weight-sync answers on its fetch port, the others on ``health_port``.

    Raises:
        ValueError: an unreadable or invalid config, or a trainer/sampler section without ``health_port``.
    """
    from nibble.config import load

    config = load(config_file)
    if role is Role.weightsync:
        return f"127.0.0.1:{config.weightsync.port}"
    port = getattr(config, role.value).health_port
    if port is None:
        raise ValueError(f"{config_file}: {role.value}.health_port is not set, so the {role.value} serves no health")
    return f"127.0.0.1:{port}"


@app.command("health")
@user_errors
def health(
    address: Annotated[
        str | None, typer.Argument(help="HOST:PORT of the health port; or give --config and --role")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="run config: ask this machine's ROLE on its port")] = None,
    role: Annotated[Role | None, typer.Option(help="the service, with --config")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the answer")] = 3.0,
) -> None:
    """Exit 0 when the service answers SERVING; 1 when it is unreachable or NOT_SERVING; 2 on bad arguments."""
    if (address is None) == (config is None) or (config is None) != (role is None):
        raise ValueError("give either HOST:PORT, or --config FILE and --role ROLE")
    if address is None:
        address = local_address(config, role)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            typer.echo(f"{address}: {exc.code().name} ({exc.details()})", err=True)
            raise typer.Exit(1) from None
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    typer.echo(f"{address}: {status}")
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise typer.Exit(1)
