"""gRPC plumbing shared by Nibble's clients and servers: message limits, keepalive, TLS, backoff and
per-message deadlines for long streams (docs/design.md §5, "Every service")."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from nibble.transport.weights.payload import MAX_CHUNK_BYTES

MAX_MESSAGE_BYTES = 2 * MAX_CHUNK_BYTES
"""Message limit (bytes) on both sides: a 4 MiB chunk plus its other fields, or a large model's manifest."""

KEEPALIVE_SECONDS = 60.0
"""Clients ping an idle connection this often, so a watch on a dead peer fails instead of hanging."""

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})
"""Status codes worth another attempt after a backoff: the peer is away or busy, not wrong."""


def channel_options() -> list[tuple[str, int]]:
    """Client channel options: the message limits and keepalive pings."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", int(KEEPALIVE_SECONDS * 1000)),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def server_options() -> list[tuple[str, int]]:
    """Server options: the message limits, and tolerance of the clients' keepalive pings."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", int(KEEPALIVE_SECONDS * 500)),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def open_channel(
    target: str, *, ca_file: Path | None = None, cert_file: Path | None = None, key_file: Path | None = None
) -> grpc.Channel:
    """A channel to ``target`` (``host:port``): TLS verified against ``ca_file`` when given, else plaintext;
    with ``cert_file``/``key_file`` the client presents its own certificate (mutual TLS).

    Raises:
        ValueError: a file cannot be read, only one of cert/key, or a client certificate without TLS.
    """
    if (cert_file is None) != (key_file is None):
        raise ValueError("a client TLS certificate and its key go together; give both or neither")
    if ca_file is None:
        if cert_file is not None:
            raise ValueError("a client certificate needs TLS: give the CA of the server's certificate too")
        return grpc.insecure_channel(target, options=channel_options())
    own = {}
    if cert_file is not None:
        own = {
            "private_key": _read(key_file, "client TLS key"),
            "certificate_chain": _read(cert_file, "client TLS certificate"),
        }
    credentials = grpc.ssl_channel_credentials(root_certificates=_read(ca_file, "TLS CA"), **own)
    return grpc.secure_channel(target, credentials, options=channel_options())


def add_port(
    server: grpc.Server,
    address: str,
    *,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    client_ca_file: Path | None = None,
) -> int:
    """Bind ``server`` to ``address`` (``host:port``, port 0 = any free one), with TLS when a certificate
    and key are given, requiring every client to present a certificate ``client_ca_file`` signed when
    that is given (mutual TLS); returns the bound port.

    Raises:
        ValueError: only one of cert/key given, a client CA without TLS, unreadable files, or the address
            could not be bound.
    """
    if (cert_file is None) != (key_file is None):
        raise ValueError("a TLS certificate and its key go together; give both or neither")
    if client_ca_file is not None and cert_file is None:
        raise ValueError("mutual TLS (a client CA) needs the server's own certificate and key")
    try:
        if cert_file is None:
            port = server.add_insecure_port(address)
        else:
            pair = (_read(key_file, "TLS key"), _read(cert_file, "TLS certificate"))
            clients = {}
            if client_ca_file is not None:
                clients = {"root_certificates": _read(client_ca_file, "client TLS CA"), "require_client_auth": True}
            port = server.add_secure_port(address, grpc.ssl_server_credentials([pair], **clients))
    except RuntimeError as exc:
        raise ValueError(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise ValueError(f"cannot listen on {address} (in use, or not an address of this host)")
    return port


def _read(path: Path | None, what: str) -> bytes:
    assert path is not None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} file {path}: {exc.strerror}") from None


@dataclass
class Backoff:
    """Bounded exponential backoff with jitter, for reconnecting.

    Delays (seconds) grow ``initial × multiplier^n`` up to ``maximum``, each scaled by a random factor in
    ``[1 − jitter, 1]`` so that many clients of one restarted server do not return in lockstep.
    """

    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.2
    _attempt: int = field(default=0, init=False, repr=False)

    def next_delay(self) -> float:
        """The delay before the next attempt (seconds); each call backs off further."""
        delay = min(self.maximum, self.initial * self.multiplier**self._attempt)
        self._attempt += 1
        return delay * (1 - self.jitter * random.random())

    def reset(self) -> None:
        """Start again from ``initial`` (after a success)."""
        self._attempt = 0

    def wait(self, stop: threading.Event | None = None) -> bool:
        """Sleep the next delay; returns ``False`` when ``stop`` was set meanwhile (give up)."""
        delay = self.next_delay()
        if stop is None:
            time.sleep(delay)
            return True
        return not stop.wait(delay)


class StallWatchdog:
    """A per-message deadline for a long stream: calls ``cancel`` when :meth:`progress` was not called
    for ``timeout`` seconds. Use as a context manager around the stream's loop.

    gRPC deadlines bound a whole call, which for a stream of many chunks must be long; this bounds the
    wait for each next message instead.
    """

    def __init__(self, timeout: float, cancel: Callable[[], object]):
        self.timeout = timeout
        self.stalled = False
        self._cancel = cancel
        self._last = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)

    def progress(self) -> None:
        """A message moved: the deadline starts again."""
        self._last = time.monotonic()

    def start(self) -> StallWatchdog:
        """Arm the deadline (from now)."""
        self._last = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Disarm it; safe to call more than once and from any thread but the watchdog's."""
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> StallWatchdog:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._done.wait(max(0.0, self._last + self.timeout - time.monotonic())):
            if time.monotonic() - self._last >= self.timeout:
                self.stalled = True
                self._cancel()
                return
