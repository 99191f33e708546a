"""The Helm chart deploy/helm/nibble's values (real helm binary, no cluster): the run config through the
services' own loader, scrape annotations, secrets per role, NOTES.txt, Redis's start command, and bad
values failing with the chart's messages."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from nibble.config import RedisConfig
from nibble.launcher import free_port
from nibble.transport.stream import connect
from tests.deploy.helm.nibble_chart import (
    FULLNAME,
    NAMESPACE,
    RELEASE,
    ROLES,
    container,
    find,
    literal_env,
    render,
    render_notes,
    run_config,
    secret_env,
    template,
    workload,
)

# --- the run config, services, metrics, secrets ---------------------------------------------------------


def test_run_config_addresses_the_charts_services(tmp_path):
    objects = render()
    config = run_config(objects, tmp_path)
    assert config.redis.url == f"redis://{FULLNAME}-redis.{NAMESPACE}.svc:6379/0"
    assert config.weightsync.host == f"{FULLNAME}-weightsync.{NAMESPACE}.svc"
    ports = {p["name"]: p["port"] for p in find(objects, "Service", "weightsync")["spec"]["ports"]}
    ws = config.weightsync
    assert ports == {"grpc-fetch": ws.port, "grpc-publish": ws.publish_port, "metrics": ws.metrics_port}
    assert find(objects, "Service", "redis")["spec"]["ports"][0]["port"] == 6379
    assert config.trainer.checkpoint_dir == Path("/data/checkpoints")
    # weight-sync binds all addresses, through the same NIBBLE_ override the services read
    server = container(find(objects, "Deployment", "weightsync"))
    assert run_config(objects, tmp_path, literal_env(server)).weightsync.host == "0.0.0.0"
    assert config.trainer.metrics_host == config.sampler.metrics_host == "0.0.0.0"
    assert config.task.name == "addition" and config.model.checkpoint == Path("/models/warm_start")


def test_every_nibble_pod_is_scraped_on_its_fixed_metrics_port(tmp_path):
    objects = render()
    config = run_config(objects, tmp_path)
    for component, section in ROLES.items():
        w = workload(objects, component)
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        port = getattr(config, section).metrics_port
        assert port > 0
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port)
        assert annotations["prometheus.io/path"] == "/metrics"
        assert {"name": "metrics", "containerPort": port} in container(w)["ports"]
    off = workload(render("metrics.annotations=false"), "trainer")["spec"]["template"]["metadata"]["annotations"]
    assert not any(key.startswith("prometheus.io/") for key in off)


def test_each_role_gets_only_its_secrets():
    objects = render()
    secret = find(objects, "Secret", "secrets")
    values = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert set(values) == {"publish-token", "fetch-token", "redis-password"}
    assert all(len(v) == 32 and v.isalnum() for v in values.values())
    name = secret["metadata"]["name"]
    expected = {
        "weightsync": {"NIBBLE_PUBLISH_TOKEN": "publish-token", "NIBBLE_FETCH_TOKEN": "fetch-token"},
        "trainer": {"NIBBLE_PUBLISH_TOKEN": "publish-token", "NIBBLE_REDIS_PASSWORD": "redis-password"},
        "sampler": {"NIBBLE_FETCH_TOKEN": "fetch-token", "NIBBLE_REDIS_PASSWORD": "redis-password"},
        "redis": {"REDIS_PASSWORD": "redis-password", "REDISCLI_AUTH": "redis-password"},
    }
    for component, keys in expected.items():
        got = secret_env(container(workload(objects, component)))
        assert got == {env: (name, key) for env, key in keys.items()}, component


def test_given_tokens_and_an_existing_secret_are_used():
    given = render("secrets.publishToken=pub", "secrets.fetchToken=fetch", "secrets.redisPassword=pw")
    data = find(given, "Secret", "secrets")["data"]
    assert {k: base64.b64decode(v).decode() for k, v in data.items()} == {
        "publish-token": "pub",
        "fetch-token": "fetch",
        "redis-password": "pw",
    }
    existing = render("secrets.existingSecret=mine")
    assert not [o for o in existing if o["kind"] == "Secret"]
    assert {ref[0] for ref in secret_env(container(workload(existing, "trainer"))).values()} == {"mine"}


def test_notes_name_the_release_s_objects(tmp_path):
    notes = render_notes(tmp_path / "gpu", "trainer.gpusPerPod=4")
    assert f"kubectl -n {NAMESPACE} logs -f job/{FULLNAME}-trainer" in notes
    assert "4 process(es) on 4 GPU(s)" in notes and "must be inside the image" in notes
    assert f"upgrade {RELEASE} <chart> --reuse-values --set samplers.replicas=N" in notes
    notes = render_notes(tmp_path / "cpu", "trainer.gpusPerPod=0", "model.existingClaim=w", "secrets.existingSecret=s")
    assert "one CPU process" in notes and "inside the image" not in notes and "Secret" not in notes


# --- Redis as the chart starts it --------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (scripts/setup)")
def test_redis_starts_as_the_services_require(tmp_path, monkeypatch):
    """The Redis container's own shell command, run here: password required, and the services' connect
    (which refuses an evicting Redis) accepts it; the readiness probe's command answers."""
    port = free_port()
    redis_container = container(find(render(f"redis.port={port}"), "Deployment", "redis"))
    script = redis_container["args"][0].replace("--dir /data", f"--dir {tmp_path}")
    process = subprocess.Popen(
        [*redis_container["command"], script],
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "REDIS_PASSWORD": "s3cret"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        anonymous = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                anonymous.ping()
                pytest.fail("Redis answered without the password")
            except redis.AuthenticationError:
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.1)
        monkeypatch.setenv("NIBBLE_REDIS_PASSWORD", "s3cret")
        client = connect(RedisConfig(url=url))
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        probe = redis_container["readinessProbe"]["exec"]["command"]
        assert subprocess.run(probe, env={"PATH": "/usr/bin:/bin", "REDISCLI_AUTH": "s3cret"}).returncode == 0
    finally:
        process.terminate()
        process.wait(timeout=10)


# --- bad values ------------------------------------------------------------------------------------------

BAD_VALUES = [
    (("trainer.gpusPerPod=-1",), (), "trainer.gpusPerPod: Must be greater than or equal to 0"),
    (("samplers.replicas=0",), (), "samplers.replicas: Must be greater than or equal to 1"),
    (("trainer.gpuPerPod=2",), (), "trainer: Additional property gpuPerPod is not allowed"),
    (("weightsync.port=70000",), (), "weightsync.port: Must be less than or equal to 65535"),
    (("samplers.extraEnv[0].name=X", "samplers.extraEnv[0].value=1"), (), "Expected: string, given: integer"),
    # the chart's own checks, which also hold when the schema is skipped
    (("trainer.gpusPerPod=-1",), ("--skip-schema-validation",), "trainer.gpusPerPod must be an integer ≥ 0, got -1"),
    (("trainer.gpusPerPod=1.5",), ("--skip-schema-validation",), "trainer.gpusPerPod must be an integer ≥ 0, got 1.5"),
    (("samplers.replicas=0",), ("--skip-schema-validation",), "samplers.replicas must be an integer ≥ 1, got 0"),
    (("weightsync.metricsPort=50051",), (), "share one pod and must differ"),
    (("config.trainer.nproc_per_node=2",), (), "config.trainer.nproc_per_node is set by the chart"),
    (("config.weightsync.host=localhost",), (), "config.weightsync.host is set by the chart"),
    (("config.num_samplers=3",), (), "config.num_samplers does not apply on Kubernetes (samplers.replicas sets"),
    (("config.trainer.health_port=1",), (), "config.trainer.health_port is set by the chart"),
    (("samplers.healthPort=9402",), (), "samplers.metricsPort and samplers.healthPort are both 9402"),
    (("securityContext.runAsUser=0",), (), "securityContext.runAsUser: Must be greater than or equal to 1"),
    (("samplers.gpusPerPod=9",), (), "samplers.gpusPerPod: Must be less than or equal to 8"),
    (
        (
            "samplers.autoscaling.enabled=true",
            "samplers.autoscaling.minReplicas=5",
            "samplers.autoscaling.maxReplicas=4",
        ),
        (),
        "samplers.autoscaling.minReplicas (5) must not exceed maxReplicas (4)",
    ),
    (("trainer.gpusPerPod=16",), (), "trainer.gpusPerPod: Must be less than or equal to 8"),
    (("trainer.resources.limits.nvidia\\.com/gpu=2",), (), "GPUs come from gpusPerPod"),
]


@pytest.mark.parametrize(("sets", "flags", "message"), BAD_VALUES, ids=[b[0][0] + " ".join(b[1]) for b in BAD_VALUES])
def test_bad_values_fail_with_the_charts_message(sets, flags, message):
    result = template(*sets, flags=flags)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "nil pointer" not in result.stderr and "error calling" not in result.stderr
