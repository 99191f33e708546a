"""Rendered manifests checked against the Kubernetes API's types, as the official Python client models them.

The client's models (``kubernetes`` ≥ 37) are pydantic models generated from the API's OpenAPI schema:
they forbid unknown fields, require the required ones and check types strictly (a string is not an
integer), which is what the API server's own decoding rejects. Stricter than the server in one place:
resource quantities must be strings (``"4"``), which is their canonical form; the chart writes them so.
"""

from __future__ import annotations

from typing import Any

import pydantic
from kubernetes import client


def model_for(manifest: dict[str, Any]) -> type[pydantic.BaseModel]:
    """The client's model of a manifest's ``apiVersion``/``kind`` (``apps/v1`` + ``Deployment`` → ``V1Deployment``).

    Raises:
        LookupError: the client has no model of that kind.
    """
    version = manifest["apiVersion"].rsplit("/", 1)[-1]
    name = version[0].upper() + version[1:] + manifest["kind"]
    model = getattr(client, name, None)
    if model is None or not isinstance(model, type) or not issubclass(model, pydantic.BaseModel):
        raise LookupError(f"no Kubernetes model named {name} for {manifest['apiVersion']} {manifest['kind']}")
    return model


def scaled_object_problems(manifest: dict[str, Any]) -> list[str]:
    """KEDA's ScaledObject (``keda.sh/v1alpha1``), whose CRD the client has no model of: the fields its
    schema requires and the types of those the chart sets (KEDA's scaler reads trigger metadata as strings)."""
    spec = manifest.get("spec", {})
    found = []
    if not isinstance(spec.get("scaleTargetRef", {}).get("name"), str):
        found.append("spec.scaleTargetRef.name: a string is required")
    for key in ("minReplicaCount", "maxReplicaCount"):
        if key in spec and not isinstance(spec[key], int):
            found.append(f"spec.{key}: an integer is required")
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        found.append("spec.triggers: at least one trigger is required")
    for i, trigger in enumerate(triggers or []):
        if not isinstance(trigger.get("type"), str):
            found.append(f"spec.triggers.{i}.type: a string is required")
        metadata = trigger.get("metadata")
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            found.append(f"spec.triggers.{i}.metadata: a mapping of strings is required")
    extra = set(spec) - {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "triggers",
        "pollingInterval",
        "cooldownPeriod",
        "idleReplicaCount",
        "advanced",
        "fallback",
    }
    found += [f"spec.{key}: not a field of ScaledObject" for key in sorted(extra)]
    return found


CUSTOM_RESOURCES = {("keda.sh/v1alpha1", "ScaledObject"): scaled_object_problems}


def problems(manifest: dict[str, Any]) -> list[str]:
    """What the API's schema rejects in ``manifest`` (empty when it is valid), one line per field."""
    custom = CUSTOM_RESOURCES.get((manifest["apiVersion"], manifest["kind"]))
    if custom is not None:
        return custom(manifest)
    try:
        model_for(manifest).model_validate(manifest)
    except LookupError as exc:
        return [str(exc)]
    except pydantic.ValidationError as exc:
        return [f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()]
    return []
