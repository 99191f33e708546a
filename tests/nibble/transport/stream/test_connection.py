"""connect(): credentials, TLS/URL checks, refusal of an evicting Redis, clear errors; retrying() across a
Redis restart and its give-up error."""

import logging
import threading
import time

import pytest

from nibble.transport.stream import (
    RedisTrajectoryReader,
    RedisTrajectoryWriter,
    RedisUnavailable,
    connect,
    read_password,
)
from tests.helpers import trajectory_group
from tests.services import RedisServer, free_port, redis_config


def test_connect_pings_and_accepts_a_noeviction_server(stream_config):
    client = connect(stream_config)
    assert client.ping()
    client.close()


def test_an_unreachable_url_names_host_and_port_quickly():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{port}"):
        connect(redis_config(f"redis://127.0.0.1:{port}/0", connect_timeout_seconds=1.0))
    assert time.monotonic() - start < 3.0


def test_an_evicting_server_is_refused_naming_its_policy(tmp_path):
    server = RedisServer(tmp_path, "--maxmemory-policy", "allkeys-lru").start()
    try:
        with pytest.raises(ValueError, match=r"maxmemory-policy allkeys-lru.*noeviction"):
            connect(redis_config(server.url))
    finally:
        server.stop()


def test_password_comes_from_the_file_or_environment_and_never_shows(tmp_path, monkeypatch, caplog):
    server = RedisServer(tmp_path / "redis", "--requirepass", "s3cret-pw").start()
    try:
        secret = tmp_path / "password"
        secret.write_text("s3cret-pw\n")
        config = redis_config(server.url, password_file=secret)
        assert read_password(config) == "s3cret-pw"
        connect(config).close()

        monkeypatch.setenv("NIBBLE_REDIS_PASSWORD", "s3cret-pw")
        connect(redis_config(server.url)).close()

        monkeypatch.setenv("NIBBLE_REDIS_PASSWORD", "wrong-pw")
        with caplog.at_level(logging.DEBUG), pytest.raises(PermissionError, match="NIBBLE_REDIS_PASSWORD") as info:
            connect(redis_config(server.url))
        assert "wrong-pw" not in str(info.value) and "wrong-pw" not in caplog.text
    finally:
        server.stop()


def test_bad_urls_and_password_files_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="holds a password") as info:
        connect(redis_config("redis://:hunter2@127.0.0.1:1/0"))
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match=r"rediss:// but redis\.tls is false"):
        connect(redis_config("rediss://127.0.0.1:1/0"))
    with pytest.raises(ValueError, match="missing-file: cannot read"):
        connect(redis_config("redis://127.0.0.1:1/0", password_file=tmp_path / "missing-file"))


def test_writes_ride_out_a_redis_restart_and_give_up_with_a_clear_error(tmp_path, caplog):
    server = RedisServer(tmp_path).start()
    try:
        config = redis_config(server.url, retry_seconds=10.0, socket_timeout_seconds=1.0)
        writer = RedisTrajectoryWriter(connect(config), config)
        writer.write(trajectory_group("before"))
        server.stop()
        restart = threading.Timer(0.5, server.start)
        restart.start()
        with caplog.at_level(logging.WARNING, logger="nibble.transport"):
            writer.write(trajectory_group("after"))  # retried until the server is back
        restart.join()
        assert f"127.0.0.1:{server.port}" in caplog.text and "retrying in" in caplog.text

        server.stop()
        impatient = RedisTrajectoryWriter(writer.client, redis_config(server.url, retry_seconds=0.3))
        with pytest.raises(RedisUnavailable, match=rf"127.0.0.1:{server.port}.*0.3 s while writing group g1"):
            impatient.write(trajectory_group("g1"))
    finally:
        server.stop()


def test_a_reader_recreates_its_group_when_redis_comes_back_empty(tmp_path, caplog):
    server = RedisServer(tmp_path).start()
    try:
        config = redis_config(server.url, retry_seconds=10.0)
        client = connect(config)
        reader = RedisTrajectoryReader(client, config, "trainer-0")
        RedisTrajectoryWriter(client, config).write(trajectory_group("lost"))
        assert len(reader.read(5)) == 1
        server.stop()
        server.start()  # no persistence: stream and consumer group are gone
        written = RedisTrajectoryWriter(client, config).write(trajectory_group("new"))
        with caplog.at_level(logging.WARNING, logger="nibble.transport"):
            assert [e.entry_id for e in reader.read(5)] == [written]
        assert "recreating it" in caplog.text
    finally:
        server.stop()


def test_tls_connects_with_the_configured_ca_and_fails_clearly_without_tls(tmp_path):
    server = RedisServer(tmp_path, tls=True).start()
    try:
        config = redis_config(server.url.replace("rediss://", "redis://"), tls=True, tls_ca_file=server.ca_file)
        client = connect(config)
        RedisTrajectoryWriter(client, config).write(trajectory_group())
        assert client.xlen(config.stream) == 1
        client.close()
        plain = redis_config(server.url.replace("rediss://", "redis://"), connect_timeout_seconds=1.0)
        with pytest.raises(RedisUnavailable, match=f"redis://127.0.0.1:{server.port}/0 is unreachable"):
            connect(plain.model_copy(update={"socket_timeout_seconds": 1.0}))
    finally:
        server.stop()
