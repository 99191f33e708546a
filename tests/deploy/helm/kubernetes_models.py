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


def problems(manifest: dict[str, Any]) -> list[str]:
    """What the API's schema rejects in ``manifest`` (empty when it is valid), one line per field."""
    try:
        model_for(manifest).model_validate(manifest)
    except LookupError as exc:
        return [str(exc)]
    except pydantic.ValidationError as exc:
        return [f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()]
    return []
