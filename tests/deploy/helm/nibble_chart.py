"""What the Helm chart tests share: the helm binary, the value sets that take every template branch, and
look-ups into rendered objects (workloads, containers, env, the run config, NOTES.txt)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from nibble.config import RunConfig, load
from nibble.launcher import Cluster

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


def every_container(objects):
    """(workload, pod spec, container) of every container and init container the chart renders."""
    for o in objects:
        if o["kind"] in ("Deployment", "Job", "StatefulSet"):
            spec = pod_spec(o)
            for c in spec.get("initContainers", []) + spec["containers"]:
                yield o, spec, c


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
