"""Every object the chart renders is valid for Kubernetes, for several Kubernetes versions.

Built-in kinds are checked against Kubernetes' own OpenAPI schemas (kubernetes-validate,
strict: unknown fields fail); the Prometheus Operator CRDs, which it does not know,
against the checked-in subsets in ``schemas/``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.packaging.chart import K8S_VERSIONS, Obj, Rendered

SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.json",
}


@cache
def _crd_validator(filename: str) -> Any:
    schema = json.loads((SCHEMAS / filename).read_text())
    return jsonschema.Draft7Validator(schema)


def validate_object(obj: Obj, version: str) -> None:
    """Raise with the object's kind, name and the offending path if it is invalid."""
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    crd = CRD_SCHEMAS.get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if crd:
        errors = sorted(_crd_validator(crd).iter_errors(obj), key=str)
        assert not errors, f"{where}: " + "; ".join(
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors
        )
        return
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise AssertionError(f"{where} (Kubernetes {version}): {path}: {exc.message}") from None


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates(rendered: Rendered, version: str) -> None:
    assert rendered.objects, f"{rendered.values_name}: nothing rendered"
    for obj in rendered.objects:
        validate_object(obj, version)


def test_object_names_are_unique(rendered: Rendered) -> None:
    seen: set[tuple[str, str, str]] = set()
    for obj in rendered.objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        assert key not in seen, f"{rendered.values_name}: {key} rendered twice"
        seen.add(key)


def test_validator_catches_a_broken_object(default: Rendered) -> None:
    """The checks above can fail: an unknown field and a wrong CRD field are caught."""
    deployment = json.loads(json.dumps(default.get("Deployment", "kelvin-query-api")))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(AssertionError, match="livenessProbes"):
        validate_object(deployment, K8S_VERSIONS[0])
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [{"port": "http", "intervall": "30s"}]},
    }
    with pytest.raises(AssertionError, match="intervall"):
        validate_object(monitor, K8S_VERSIONS[0])
