"""Connecting to the trajectory Redis (password, TLS, a safe server) and riding out its loss (docs/design.md §5).

The password comes from ``RedisConfig.password_file`` or ``NIBBLE_REDIS_PASSWORD`` and never appears in
an error or a log line: messages name the server as ``scheme://host:port/db`` only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from nibble.config import RedisConfig

logger = logging.getLogger(__name__)

PASSWORD_ENV = "NIBBLE_REDIS_PASSWORD"
MIN_SERVER_VERSION = (6, 2)  # XAUTOCLAIM
FIRST_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 5.0
# Errors of a lost or restarting server; anything else (a wrong command, bad credentials) is not retried.
TRANSIENT_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)

T = TypeVar("T")


class RedisUnavailable(ConnectionError):
    """Redis could not be reached (at start-up), or stayed unreachable for ``RedisConfig.retry_seconds``."""


def connect(config: RedisConfig) -> redis.Redis:
    """A client of the Redis at ``config.url``, checked: reachable, credentials accepted, version ≥ 6.2,
    and ``maxmemory-policy noeviction`` (any other policy may evict unread stream entries).

    The client itself does not retry; callers wrap commands in :func:`retrying`.

    Raises:
        ValueError: a password inside the URL, a ``rediss://`` URL without ``tls``, an unreadable password
            file, an old server, or an evicting ``maxmemory-policy`` (named).
        RedisUnavailable: nothing answers at the URL within ``connect_timeout_seconds`` (names host:port).
        PermissionError: the server refused the credentials.
    """
    url = _url(config)
    where = describe_url(url)
    kwargs: dict = {}
    if config.tls and config.tls_ca_file is not None:
        kwargs["ssl_ca_certs"] = str(config.tls_ca_file)
    client = redis.Redis.from_url(
        url,
        password=read_password(config),
        socket_connect_timeout=config.connect_timeout_seconds,
        socket_timeout=config.socket_timeout_seconds,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )
    try:
        _check_server(client, where)
    except BaseException:
        client.close()
        raise
    return client


def read_password(config: RedisConfig) -> str | None:
    """The password from ``config.password_file`` (trailing newline dropped), else ``NIBBLE_REDIS_PASSWORD``,
    else ``None``.

    Raises:
        ValueError: the file cannot be read or is empty (naming the file, never its content).
    """
    if config.password_file is None:
        return os.environ.get(PASSWORD_ENV) or None
    try:
        password = config.password_file.read_text().rstrip("\r\n")
    except OSError as exc:
        raise ValueError(f"redis.password_file {config.password_file}: cannot read ({exc.strerror or exc})") from None
    if not password:
        raise ValueError(f"redis.password_file {config.password_file} is empty")
    return password


def describe_url(url: str) -> str:
    """``scheme://host:port/db`` of a Redis URL: what messages may show (no user name or password)."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return urlunsplit((parts.scheme, f"{host}:{parts.port or 6379}", parts.path or "/0", "", ""))


def describe_client(client: redis.Redis) -> str:
    """``host:port/db`` of a client's server, for log lines."""
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}/{kwargs.get('db', 0)}"


def retrying(client: redis.Redis, config: RedisConfig, what: str, command: Callable[[], T]) -> T:
    """Run ``command``; while Redis is unreachable, retry with backoff 0.1 s doubling to 5 s, logging each
    retry, for at most ``config.retry_seconds`` (wall clock) in all.

    A retried write may have been applied before its reply was lost: callers keep commands idempotent or
    tolerate a duplicate (the trainer's ledger drops a group written twice).

    Raises:
        RedisUnavailable: Redis stayed unreachable; names the server, ``what`` and the last error.
    """
    deadline = time.monotonic() + config.retry_seconds
    delay = FIRST_BACKOFF_SECONDS
    attempt = 1
    while True:
        try:
            return command()
        except TRANSIENT_ERRORS as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RedisUnavailable(
                    f"Redis at {describe_client(client)} unreachable for {config.retry_seconds:g} s while {what}: {exc}"
                ) from exc
            pause = min(delay, left)
            logger.warning(
                "Redis at %s failed while %s (attempt %d): %s; retrying in %.1f s",
                describe_client(client),
                what,
                attempt,
                exc,
                pause,
            )
            time.sleep(pause)
            delay = min(2 * delay, MAX_BACKOFF_SECONDS)
            attempt += 1


def _url(config: RedisConfig) -> str:
    parts = urlsplit(config.url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"redis.url must start with redis:// or rediss://, got {parts.scheme or 'no'} scheme")
    if parts.password:
        raise ValueError(
            f"redis.url {describe_url(config.url)} holds a password; put it in redis.password_file or {PASSWORD_ENV}"
        )
    if parts.scheme == "rediss" and not config.tls:
        raise ValueError(f"redis.url {describe_url(config.url)} uses rediss:// but redis.tls is false")
    return urlunsplit(parts._replace(scheme="rediss")) if config.tls else config.url


def _check_server(client: redis.Redis, where: str) -> None:
    try:
        client.ping()
        server, memory = client.info("server"), client.info("memory")
    except redis.AuthenticationError as exc:
        raise PermissionError(
            f"Redis at {where} refused the credentials ({exc}); check redis.password_file or {PASSWORD_ENV}"
        ) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(f"Redis at {where} is unreachable: {exc}") from exc
    version = tuple(int(p) for p in str(server["redis_version"]).split(".")[:2])
    if version < MIN_SERVER_VERSION:
        raise ValueError(f"Redis at {where} is version {server['redis_version']}; Nibble needs 6.2 or newer")
    policy = memory.get("maxmemory_policy")
    if policy != "noeviction":
        raise ValueError(
            f"Redis at {where} has maxmemory-policy {policy}, which can evict unread trajectories; "
            "Nibble needs maxmemory-policy noeviction"
        )
