"""Security end to end: gRPC over mutual TLS with certificates made here, secrets only from files or the
environment, and no secret value in any log line of the services, failures included."""

from __future__ import annotations

import logging
import subprocess
import sys

import grpc
import pytest
import yaml

from nibble.config import RunConfig, load
from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import published_state
from nibble.transport.stream import RedisTrajectoryReader, RedisTrajectoryWriter, connect
from nibble.transport.weights import publisher_from_config, subscriber_from_config
from tests.reliability.conftest import make_group
from tests.services import RedisServer, free_port, redis_config

PUBLISH_SECRET, FETCH_SECRET, REDIS_SECRET = "pub-5ecret-7c1e", "fetch-5ecret-93ab", "redis-5ecret-d2f0"


def openssl(directory, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def certificates(directory) -> None:
    """``ca`` signs ``server`` (for 127.0.0.1) and ``client``; ``rogue-ca`` signs ``rogue``."""
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for ca in ("ca", "rogue-ca"):
        openssl(directory, "req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "1",
                "-subj", f"/CN={ca}")  # fmt: skip
    for name, ca in (("server", "ca"), ("client", "ca"), ("rogue", "rogue-ca")):
        openssl(directory, "req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        extra = ["-extfile", "san.ext"] if name == "server" else []
        openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", *extra)  # fmt: skip


@pytest.fixture
def secured(tmp_path):
    """A run config for a weight-sync process on mutual TLS with token files, and a Redis with a password."""
    certificates(tmp_path)
    for name, secret in (("publish", PUBLISH_SECRET), ("fetch", FETCH_SECRET), ("redis", REDIS_SECRET)):
        (tmp_path / f"{name}.token").write_text(secret + "\n")
    server = RedisServer(tmp_path / "redis", "--requirepass", REDIS_SECRET).start()
    weightsync = {
        "host": "127.0.0.1", "port": free_port(), "publish_port": free_port(), "store_dir": str(tmp_path / "store"),
        "publish_token_file": str(tmp_path / "publish.token"), "fetch_token_file": str(tmp_path / "fetch.token"),
        "tls_cert_file": str(tmp_path / "server.crt"), "tls_key_file": str(tmp_path / "server.key"),
        "tls_ca_file": str(tmp_path / "ca.crt"), "tls_client_ca_file": str(tmp_path / "ca.crt"),
        "tls_client_cert_file": str(tmp_path / "client.crt"), "tls_client_key_file": str(tmp_path / "client.key"),
        "rpc_timeout_seconds": 5.0, "chunk_bytes": 65536,
    }  # fmt: skip
    redis_section = redis_config(server.url, password_file=tmp_path / "redis.token").model_dump(mode="json")
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump({"weightsync": weightsync, "redis": redis_section}))
    yield load(file, environ={}), file, tmp_path
    server.stop()


def test_mutual_tls_tokens_from_files_and_no_secret_in_any_log(secured, caplog):
    config, file, tmp_path = secured
    caplog.set_level(logging.DEBUG)
    process = subprocess.Popen(
        [sys.executable, "-m", "nibble.weightsync", "--config", str(file), "--log-level", "DEBUG"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert process.stdout.readline().startswith("READY"), "weight-sync did not start"
        ws = config.weightsync
        model = MoETransformer(tiny(vocab_size=16), PrecisionPlan(num_layers=4, format="bf16"))
        plan = model.plan
        publisher_from_config(ws).publish(1, published_state(model), plan)  # mutual TLS, token from its file
        manifest, _ = subscriber_from_config(ws, "s").fetch(1)
        assert manifest.policy_version == 1

        # refused: no client certificate, a certificate of another CA, plaintext, a wrong token
        refused = [
            ws.model_copy(update={"tls_client_cert_file": None, "tls_client_key_file": None}),
            ws.model_copy(update={"tls_client_cert_file": tmp_path / "rogue.crt",
                                  "tls_client_key_file": tmp_path / "rogue.key"}),
        ]  # fmt: skip
        for settings in refused:
            with pytest.raises(grpc.RpcError) as info:
                subscriber_from_config(settings, "s").latest_version()
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        (tmp_path / "wrong.token").write_text("not-the-token\n")
        wrong = ws.model_copy(update={"publish_token_file": tmp_path / "wrong.token"})
        with pytest.raises(grpc.RpcError) as info:
            publisher_from_config(wrong).publish(2, published_state(model), plan)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

        # Redis: the password from its file works; a wrong one fails naming the server, not the secret
        client = connect(config.redis)
        RedisTrajectoryWriter(client, config.redis).write(make_group("g", [[3, 4], [5, 6]]))
        assert len(RedisTrajectoryReader(client, config.redis, "trainer").read(1)) == 1
        (tmp_path / "wrong-redis.token").write_text("nope\n")
        with pytest.raises(PermissionError, match="refused the credentials") as failure:
            connect(config.redis.model_copy(update={"password_file": tmp_path / "wrong-redis.token"}))
        messages = [str(failure.value), str(info.value)]
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    lines = output.splitlines() + [r.getMessage() for r in caplog.records] + messages
    assert any("UNAUTHENTICATED" in line or "token" in line.lower() for line in lines)  # the failures were logged
    for secret in (PUBLISH_SECRET, FETCH_SECRET, REDIS_SECRET):
        leaked = [line for line in lines if secret in line]
        assert not leaked, f"secret in logs: {leaked[:3]}"


def test_secrets_are_never_config_values(tmp_path):
    for section, key in (("weightsync", "publish_token"), ("weightsync", "fetch_token"), ("redis", "password")):
        file = tmp_path / "run.yaml"
        file.write_text(yaml.safe_dump({section: {key: "s3cret"}}))
        with pytest.raises(ValueError, match=f"{section}.{key}: Extra inputs are not permitted") as info:
            load(file, environ={})
        assert "s3cret" not in str(info.value)
    with pytest.raises(ValueError, match=r"tls_client_cert_file and weightsync\.tls_client_key_file go together"):
        RunConfig(weightsync={"tls_client_cert_file": "c.crt"})
