"""The Helm chart deploy/helm/nibble, rendered with the real helm binary (no cluster): lint, every object
against the Kubernetes API's types, the trainer's GPUs/command/config per gpusPerPod, the run config
through the services' own loader, secrets per role, scrape annotations, Redis's start command, pod
security and gRPC health probes, sampler scaling that touches nothing else, and bad values failing with
the chart's messages."""

from __future__ import annotations

import base64
import functools
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from nibble.config import RedisConfig, RunConfig, load
from nibble.launcher import Cluster, free_port
from nibble.transport.stream import connect
from tests.deploy.helm.kubernetes_models import problems

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "nibble"
HELM = str(Path(sys.executable).with_name("helm"))
RELEASE, NAMESPACE = "rl", "research"
FULLNAME = f"{RELEASE}-nibble"
CONFIG_PATH = "/etc/nibble/config.yaml"
ROLES = {"weightsync": "weightsync", "trainer": "trainer", "sampler": "sampler"}  # component → config section

# Value sets that between them take every branch of the templates.
CASES = {
    "defaults": (),
    "cpu trainer": ("trainer.gpusPerPod=0",),
    "4-GPU trainer, 3 samplers": ("trainer.gpusPerPod=4", "samplers.replicas=3", "samplers.gpusPerPod=1"),
    "claims and options": (
        "model.existingClaim=warm-start",
        "trainer.persistence.existingClaim=ckpt",
        "weightsync.persistence.enabled=true",
        "redis.persistence.enabled=false",
        "redis.auth=false",
        "networkPolicy.enabled=false",
        "metrics.annotations=false",
        "secrets.existingSecret=mine",
        "imagePullSecrets[0].name=registry",
        "trainer.nodeSelector.gpu=h200",
        "trainer.tolerations[0].key=nvidia.com/gpu",
        "trainer.tolerations[0].operator=Exists",
        "samplers.extraEnv[0].name=HF_HUB_OFFLINE",
        "samplers.extraEnv[0].value=yes",
        "weightsync.podAnnotations.team=rl",
        "samplers.podDisruptionBudget.enabled=false",
    ),
    "autoscaling (HPA)": ("samplers.autoscaling.enabled=true",),
    "autoscaling (KEDA)": ("samplers.autoscaling.enabled=true", "samplers.autoscaling.keda=true"),
}


def helm(command: str, *sets: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``helm COMMAND [RELEASE] CHART --namespace NAMESPACE FLAGS --set S ...``."""
    release = (RELEASE,) if command == "template" else ()
    values = [arg for s in sets for arg in ("--set", s)]
    argv = [HELM, command, *release, str(CHART), "--namespace", NAMESPACE, *flags, *values]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def template(*sets: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return helm("template", *sets, flags=flags)


@functools.cache
def render(*sets: str) -> tuple[dict, ...]:
    result = template(*sets)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def find(objects, kind: str, component: str) -> dict:
    (found,) = (
        o
        for o in objects
        if o["kind"] == kind and o["metadata"]["labels"].get("app.kubernetes.io/component") == component
    )
    return found


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def container(workload: dict) -> dict:
    (only,) = pod_spec(workload)["containers"]
    return only


def workload(objects, component: str) -> dict:
    return find(objects, "Job" if component == "trainer" else "Deployment", component)


def run_config(objects, tmp_path: Path, environ: dict[str, str] | None = None) -> RunConfig:
    """The ConfigMap's config.yaml, loaded by the loader the services use (``--config``)."""
    path = tmp_path / "config.yaml"
    path.write_text(find(objects, "ConfigMap", "config")["data"]["config.yaml"])
    return load(path, environ=environ or {})


def literal_env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def secret_env(c: dict) -> dict[str, tuple[str, str]]:
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def launcher_trainer_argv(nproc: int) -> list[str]:
    """The trainer's argv as ``nibble run`` builds it (nibble/launcher.py), with ``python`` for the interpreter."""
    started = []
    cluster = Cluster(Path("unused"))
    cluster.start = lambda name, argv, stage="", env=None: started.append(argv)
    cluster.start_service("trainer", "nibble.trainer", Path(CONFIG_PATH), "--out", "/data/out", nproc_per_node=nproc)
    return ["python", *started[0][1:]]


# --- lint and the Kubernetes schema ------------------------------------------------------------------


@pytest.mark.parametrize("sets", list(CASES.values()), ids=list(CASES))
def test_helm_lint_is_clean(sets):
    result = helm("lint", *sets, flags=("--strict",))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("sets", list(CASES.values()), ids=list(CASES))
def test_every_rendered_object_matches_the_kubernetes_api(sets):
    objects = render(*sets)
    assert {o["kind"] for o in objects} >= {"ConfigMap", "Deployment", "Job", "Service"}
    for o in objects:
        assert problems(o) == [], f"{o['kind']} {o['metadata']['name']}"
        assert o["metadata"]["namespace"] == NAMESPACE
        assert o["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_the_schema_check_rejects_broken_manifests():
    job = find(render(), "Job", "trainer")
    assert problems(job) == []

    def broken(change) -> list[str]:
        copy = yaml.safe_load(yaml.safe_dump(job))
        change(copy)
        return problems(copy)

    unknown = broken(lambda j: container(j).update(imagePullPolicyy="Always"))
    assert unknown == ["spec.template.spec.containers.0.imagePullPolicyy: Extra inputs are not permitted"]
    missing = broken(lambda j: container(j).pop("name"))
    assert missing == ["spec.template.spec.containers.0.name: Field required"]
    wrong_type = broken(lambda j: j["spec"].update(backoffLimit="ten"))
    assert len(wrong_type) == 1 and wrong_type[0].startswith("spec.backoffLimit: Input should be a valid integer")
    no_containers = broken(lambda j: pod_spec(j).pop("containers"))
    assert no_containers == ["spec.template.spec.containers: Field required"]
    assert broken(lambda j: j.update(kind="Jobb")) == ["no Kubernetes model named V1Jobb for batch/v1 Jobb"]


# --- the trainer's GPUs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "nproc", "device"),
    [(None, 1, "cuda"), (0, 1, "cpu"), (1, 1, "cuda"), (4, 4, "cuda")],
    ids=["default", "0", "1", "4"],
)
def test_trainer_follows_gpus_per_pod(gpus, nproc, device, tmp_path):
    objects = render(*(() if gpus is None else (f"trainer.gpusPerPod={gpus}",)))
    trainer = container(find(objects, "Job", "trainer"))
    assert trainer["command"] == launcher_trainer_argv(nproc)
    if nproc > 1:
        assert trainer["command"][:6] == [
            "python",
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
        ]
    else:
        assert trainer["command"][:3] == ["python", "-m", "nibble.trainer"]
    limits, requests = trainer["resources"].get("limits", {}), trainer["resources"].get("requests", {})
    expected_gpus = 1 if gpus is None else gpus
    if expected_gpus:
        assert limits["nvidia.com/gpu"] == str(expected_gpus)
    else:
        assert "nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in requests
    config = run_config(objects, tmp_path)
    assert (config.trainer.nproc_per_node, config.trainer.device) == (nproc, device)
    shm = [v for v in pod_spec(find(objects, "Job", "trainer"))["volumes"] if v["name"] == "shm"]
    assert bool(shm) == (nproc > 1)


def test_sampler_replicas_and_gpus(tmp_path):
    objects = render("samplers.replicas=3", "samplers.gpusPerPod=1")
    samplers = find(objects, "Deployment", "sampler")
    assert samplers["spec"]["replicas"] == 3
    sampler = container(samplers)
    assert sampler["command"] == ["python", "-m", "nibble.sampler", "--config", CONFIG_PATH, "--name", "$(POD_NAME)"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in sampler["env"]
    assert sampler["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in container(find(render(), "Deployment", "sampler"))["resources"]["limits"]


def test_scaling_samplers_changes_only_the_samplers_deployment():
    """`helm upgrade --set samplers.replicas=7` must leave the trainer's Job (whose pod template Kubernetes
    refuses to patch), weight-sync's pod (a new config checksum would restart it) and the config alone."""
    # fixed secrets: on a real upgrade the chart keeps the cluster's (lookup); `helm template` has no cluster
    tokens = ("secrets.publishToken=p", "secrets.fetchToken=f", "secrets.redisPassword=r")
    before = {(o["kind"], o["metadata"]["name"]): o for o in render(*tokens)}
    after = {(o["kind"], o["metadata"]["name"]): o for o in render(*tokens, "samplers.replicas=7")}
    assert before.keys() == after.keys()
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {("Deployment", f"{FULLNAME}-sampler")}
    scaled = after[("Deployment", f"{FULLNAME}-sampler")]
    assert scaled["spec"]["replicas"] == 7
    scaled["spec"]["replicas"] = 2
    assert scaled == before[("Deployment", f"{FULLNAME}-sampler")]  # its pod template is untouched too


def every_container(objects):
    """(workload, pod spec, container) of every container and init container the chart renders."""
    for o in objects:
        if o["kind"] in ("Deployment", "Job", "StatefulSet"):
            spec = pod_spec(o)
            for c in spec.get("initContainers", []) + spec["containers"]:
                yield o, spec, c


@pytest.mark.parametrize("sets", list(CASES.values()), ids=list(CASES))
def test_every_container_runs_restricted(sets):
    """The restricted Pod Security Standard, and a root filesystem nothing writes to (/tmp is a volume)."""
    seen = set()
    for o, spec, c in every_container(render(*sets)):
        pod, own = spec["securityContext"], c.get("securityContext", {})
        name = f"{o['kind']} {o['metadata']['name']} container {c['name']}"
        assert own.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, name
        assert own.get("runAsUser", pod.get("runAsUser")) > 0, name
        assert own.get("seccompProfile", pod.get("seccompProfile")) == {"type": "RuntimeDefault"}, name
        assert own["allowPrivilegeEscalation"] is False, name
        assert own["readOnlyRootFilesystem"] is True, name
        assert own["capabilities"] == {"drop": ["ALL"]}, name
        assert "privileged" not in own, name
        tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert tmp and {"name": tmp[0]["name"], "emptyDir": {}} in spec["volumes"], name
        seen.add(o["metadata"]["labels"]["app.kubernetes.io/component"])
    assert seen == {"redis", "weightsync", "trainer", "sampler"}


def test_probes_ask_grpc_health_where_each_service_serves_it(tmp_path):
    objects = render("probes.startupSeconds=600")
    config = run_config(objects, tmp_path)
    health_ports = {
        "weightsync": config.weightsync.port,
        "trainer": config.trainer.health_port,
        "sampler": config.sampler.health_port,
    }
    assert len(set(health_ports.values())) == 3 and None not in health_ports.values()
    for component, port in health_ports.items():
        c = container(workload(objects, component))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": port}, (component, probe)
        assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 600
        assert port in {p["containerPort"] for p in c["ports"]}


def test_samplers_have_a_disruption_budget():
    (pdb,) = (o for o in render() if o["kind"] == "PodDisruptionBudget")
    samplers = find(render(), "Deployment", "sampler")
    assert pdb["spec"]["selector"] == samplers["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert not [o for o in render("samplers.podDisruptionBudget.enabled=false") if o["kind"] == "PodDisruptionBudget"]


def test_autoscaling_takes_the_replica_count_from_nibble_sampler_demand():
    fixed = find(render(), "Deployment", "sampler")
    assert fixed["spec"]["replicas"] == 2
    assert not [o for o in render() if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")]

    objects = render("samplers.autoscaling.enabled=true", "samplers.autoscaling.maxReplicas=32")
    assert "replicas" not in find(objects, "Deployment", "sampler")["spec"]  # helm upgrade never fights the HPA
    hpa = find(objects, "HorizontalPodAutoscaler", "sampler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{FULLNAME}-sampler"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 32)
    (metric,) = hpa["metrics"]
    assert metric["external"]["metric"] == {
        "name": "nibble_sampler_demand",
        "selector": {"matchLabels": {"namespace": NAMESPACE}},
    }
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}  # a sampler per unit

    keda = render("samplers.autoscaling.enabled=true", "samplers.autoscaling.keda=true")
    assert "replicas" not in find(keda, "Deployment", "sampler")["spec"]
    scaled = find(keda, "ScaledObject", "sampler")["spec"]
    assert scaled["scaleTargetRef"] == {"name": f"{FULLNAME}-sampler"}
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "1"
    assert trigger["metadata"]["query"] == f'max(nibble_sampler_demand{{namespace="{NAMESPACE}"}})'
    assert not [o for o in keda if o["kind"] == "HorizontalPodAutoscaler"]
    own = render("samplers.autoscaling.enabled=true", "samplers.autoscaling.keda=true", "samplers.autoscaling.query=q")
    assert find(own, "ScaledObject", "sampler")["spec"]["triggers"][0]["metadata"]["query"] == "q"
    broken = dict(
        find(keda, "ScaledObject", "sampler"), spec={"triggers": [{"type": "prometheus", "metadata": {"a": 1}}]}
    )
    assert problems(broken) == [
        "spec.scaleTargetRef.name: a string is required",
        "spec.triggers.0.metadata: a mapping of strings is required",
    ]


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


def render_notes(tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as ``helm install`` would print it: ``helm template`` skips NOTES.txt (and ``install
    --dry-run`` needs a cluster), so a copy of the chart carries it as a ConfigMap's value."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes.tpl").write_text('{{- define "notes" -}}\n' + notes + "{{- end -}}\n")
    (chart / "templates" / "notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: {{ include "notes" . | quote }}\n'
    )
    values = [arg for s in sets for arg in ("--set", s)]
    argv = [HELM, "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--show-only", "templates/notes.yaml"]
    result = subprocess.run([*argv, *values], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["data"]["notes"]


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
