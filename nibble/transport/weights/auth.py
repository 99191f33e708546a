"""Bearer tokens on gRPC (docs/design.md §5, "Access"): the server-side check and the client-side metadata.

Every RPC carries ``authorization: Bearer <token>``; publish and fetch tokens are separate. Tokens
come from a file or an environment variable, never from config values, and are never logged. A server
given no token accepts every caller: the service logs a warning at start-up, and this is meant only
for a single machine or a network that already restricts who reaches the port.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc

PUBLISH_TOKEN_ENV = "NIBBLE_PUBLISH_TOKEN"
FETCH_TOKEN_ENV = "NIBBLE_FETCH_TOKEN"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
"""Health checks answer without a token (probes carry none; they reveal nothing but liveness)."""


def read_token(file: Path | None, env_var: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The token from ``file`` when given, else from the environment variable ``env_var``, else ``None``.

    Surrounding whitespace (a trailing newline) is stripped.

    Raises:
        ValueError: ``file`` is given but unreadable or empty (the message never holds the token).
    """
    if file is not None:
        try:
            token = Path(file).read_text().strip()
        except OSError as exc:
            raise ValueError(f"token file {file}: {exc.strerror}") from None
        if not token:
            raise ValueError(f"token file {file} is empty")
        return token
    token = (os.environ if environ is None else environ).get(env_var, "").strip()
    return token or None


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token`` (nothing when ``None``)."""
    return () if token is None else (("authorization", f"Bearer {token}"),)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Rejects every call whose ``authorization`` metadata is not ``Bearer <token>`` with
    ``UNAUTHENTICATED``, before the handler runs (health checks are exempt).

    Args:
        token: the expected token.
        on_reject: called with the RPC's method name for each rejected call (e.g. to count it).
    """

    def __init__(self, token: str, *, on_reject: Callable[[str], object] | None = None):
        if not token:
            raise ValueError("a bearer-token interceptor needs a non-empty token")
        self._expected = f"Bearer {token}".encode()
        self._on_reject = on_reject

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(HEALTH_PREFIX):
            return handler
        presented = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(presented.encode(), self._expected):
            return handler
        if self._on_reject is not None:
            self._on_reject(method)
        return _denied(handler, "missing bearer token" if not presented else "invalid bearer token")


def _denied(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that answers ``UNAUTHENTICATED`` at once."""

    def deny(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(
        deny, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
