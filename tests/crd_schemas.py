"""Strict validation of custom resources (KServe, Prometheus Operator) against their CRDs' schemas
(tests/data/k8s_schemas/README.md says where each comes from)."""

from __future__ import annotations

import functools
import gzip
import json
from typing import Any

import jsonschema
from locations import DATA

SCHEMAS = DATA / "k8s_schemas"


def strict(schema: Any) -> Any:
    """``schema`` with unknown fields refused wherever it lists properties and neither allows more nor keeps
    unknown fields: what the API server's strict field validation does."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: strict(value) for key, value in schema.items()}
    if "properties" in result and "additionalProperties" not in result \
            and not result.get("x-kubernetes-preserve-unknown-fields"):
        result["additionalProperties"] = False
    return result


@functools.cache
def validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    group, version = api_version.split("/")
    path = SCHEMAS / f"{group}_{version}_{kind.lower()}.json.gz"
    schema = strict(json.loads(gzip.decompress(path.read_bytes())))
    return jsonschema.Draft7Validator(schema)


def validate(obj: dict[str, Any]) -> None:
    """Raise :class:`jsonschema.ValidationError` for the first problem of ``obj`` against its CRD's schema."""
    validator(obj["apiVersion"], obj["kind"]).validate(obj)
