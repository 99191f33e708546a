"""docker-compose.yml against the Compose specification (the compose_spec parser, strict about unknown
keys, and its models of the specification's schema), and against Nibble's own config: addresses, ports,
health checks, the scaling of samplers, pod-like hardening, Prometheus's targets."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from compose_spec import PyCompose

from nibble.config import RunConfig, load

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
NIBBLE_SERVICES = ("weightsync", "trainer", "sampler")
CONFIG_TARGET = "/etc/nibble/config.yaml"


def parse(text: str) -> PyCompose:
    """The file as Compose reads it: YAML (merge keys resolved), then the specification's parser."""
    return PyCompose.from_json(json.dumps(yaml.safe_load(text)))


@pytest.fixture(scope="module")
def compose() -> dict:
    parsed = parse(COMPOSE_FILE.read_text())
    parsed.validate()  # every volume, config, network and secret a service names is declared
    parsed.to_spec()  # and the whole matches the specification's models
    return parsed.to_dict()


def environment(service: dict) -> dict[str, str]:
    """A service's literal environment (``NAME=value`` entries; bare names pass the host's through)."""
    return dict(entry.split("=", 1) for entry in service.get("environment", []) if "=" in entry)


def service_config(compose: dict, name: str) -> RunConfig:
    """The run config as service ``name`` loads it: the mounted file plus its NIBBLE_* environment."""
    service = compose["services"][name]
    (mount,) = [c for c in service["configs"] if c["target"] == CONFIG_TARGET]
    return load(ROOT / compose["configs"][mount["source"]]["file"], environ=environment(service))


def dockerfile_targets() -> dict[str, str]:
    """Each Dockerfile stage's text by its name."""
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    return {re.match(r"\S+ AS (\S+)", s).group(1): s for s in stages}


def test_the_specification_refuses_what_compose_refuses():
    text = COMPOSE_FILE.read_text()
    with pytest.raises(ValueError, match="replica"):
        parse(text.replace("  sampler:\n", "  sampler:\n    replica: 3\n", 1))
    broken = parse(text.replace("    - source: run\n", "    - source: runn\n", 1))
    with pytest.raises(ValueError, match="config `runn`"):
        broken.validate()


def test_every_named_volume_is_declared(compose):
    """Compose refuses an undeclared named volume; compose_spec's validate() does not check volumes."""
    for name, service in compose["services"].items():
        for mount in service.get("volumes", []):
            source = mount.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], (name, source)
            else:
                assert (ROOT / source).exists() or source in ("./deploy/prometheus", "./deploy/grafana"), (name, source)


def test_services_find_each_other_by_service_name(compose):
    services = compose["services"]
    for name in NIBBLE_SERVICES:
        config = service_config(compose, name)
        assert config.redis.url.startswith("redis://redis:6379/")
        if name != "weightsync":
            assert config.weightsync.host == "weightsync"
        for dependency in services[name].get("depends_on", {}):
            assert dependency in services, (name, dependency)
    assert {"redis", "weightsync", "trainer", "sampler", "prometheus", "grafana"} <= set(services)
    # weight-sync binds every address of its container, through the override the services read
    assert service_config(compose, "weightsync").weightsync.host == "0.0.0.0"


def test_each_nibble_service_is_its_dockerfile_target_with_a_health_check_it_answers(compose):
    targets = dockerfile_targets()
    for name in NIBBLE_SERVICES:
        service = compose["services"][name]
        assert service["build"] == {"context": ".", "target": name}
        stage = targets[name]
        healthcheck = re.search(r"^HEALTHCHECK .*\\\n\s+CMD (.*)$", stage, flags=re.M).group(1)
        assert healthcheck == f"nibble health --config {CONFIG_TARGET} --role {name}"
        config = service_config(compose, name)
        if name != "weightsync":  # weight-sync answers health on its fetch port
            section = getattr(config, name)
            assert section.health_port is not None and section.metrics_host == "0.0.0.0"
    assert compose["services"]["warm-start"]["build"]["target"] == "runtime" and "runtime" in targets


def test_samplers_scale_with_no_per_sampler_settings(compose):
    sampler = compose["services"]["sampler"]
    for per_container in ("container_name", "ports", "hostname"):
        assert per_container not in sampler
    assert environment(sampler) == {}  # a token passed through at most; nothing that differs per replica
    assert "num_samplers" not in yaml.safe_load((ROOT / "configs" / "compose.yaml").read_text())


def test_every_container_runs_hardened(compose):
    for name, service in compose["services"].items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert "privileged" not in service, name
    assert compose["services"]["redis"]["user"] == "999:999"


def test_redis_keeps_the_stream(compose):
    command = compose["services"]["redis"]["command"]
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert flags["--maxmemory-policy"] == "noeviction" and flags["--appendonly"] == "yes"
    assert "redis:/data" in compose["services"]["redis"]["volumes"]


def test_the_warm_start_is_the_runs(compose):
    config = service_config(compose, "trainer")
    (script,) = compose["services"]["warm-start"]["command"]
    argv = shlex.split(script.split("||", 1)[1])
    options = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--task-option")
    assert {k: yaml.safe_load(v) for k, v in options.items()} == config.task.options
    value = {arg: argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg.startswith("--")}
    assert value["--task"] == config.task.name and float(value["--target-accuracy"]) == config.model.sft_target_accuracy
    assert value["--out"] == str(config.model.checkpoint) and int(value["--seed"]) == config.seed
    assert f"test -f {config.model.checkpoint}/config.json" in script


def test_prometheus_scrapes_every_metrics_port(compose):
    prometheus = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    trainer = service_config(compose, "trainer")
    assert jobs["weightsync"]["static_configs"][0]["targets"] == [f"weightsync:{trainer.weightsync.metrics_port}"]
    assert jobs["trainer"]["static_configs"][0]["targets"] == [f"trainer:{trainer.trainer.metrics_port}"]
    (samplers,) = jobs["sampler"]["dns_sd_configs"]  # every replica, by the service's name
    assert (
        samplers["names"] == ["sampler"] and samplers["port"] == service_config(compose, "sampler").sampler.metrics_port
    )
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/compose/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts
    assert prometheus["rule_files"] == ["/etc/prometheus/rules/*.yaml"]
    assert "./deploy/prometheus:/etc/prometheus/rules:ro" in mounts


def test_grafana_is_provisioned_with_the_compose_prometheus(compose):
    provisioning = ROOT / "deploy" / "compose" / "grafana"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "nibble.yaml").read_text())["providers"]
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana:{provider['options']['path']}:ro" in mounts
    assert "./deploy/compose/grafana:/etc/grafana/provisioning:ro" in mounts
