"""The Helm chart deploy/helm/nibble, rendered with the real helm binary (no cluster): lint, every object
against the Kubernetes API's types, the trainer's GPUs/command/config per gpusPerPod, sampler scaling that
touches nothing else, pod security and gRPC health probes, and the autoscaler's metric.

The run config, secrets, scrape annotations, NOTES.txt, Redis and bad values: test_nibble_chart_values.py."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.helm.kubernetes_models import problems
from tests.deploy.helm.nibble_chart import (
    CASES,
    CONFIG_PATH,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    container,
    every_container,
    find,
    helm,
    launcher_trainer_argv,
    pod_spec,
    render,
    run_config,
    workload,
)

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
