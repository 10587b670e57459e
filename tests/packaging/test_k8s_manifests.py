"""k8s/: the plain manifests build with `kubectl kustomize`, validate, and match the chart."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.packaging import k8s_manifests
from tests.packaging.chart import (
    K8S_VERSIONS,
    ROOT,
    WORKLOAD_KINDS,
    Obj,
    Rendered,
    containers,
)
from tests.packaging.test_chart_validate import validate_object
from tests.support.servers import require_binary

HASH_SUFFIX = re.compile(r"-[a-z0-9]{10}$")


def kustomize(path: str) -> list[Obj]:
    kubectl = require_binary("kubectl", "kubectl")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, f"kubectl kustomize {path}: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize("k8s/base")


@pytest.fixture(scope="module")
def dev() -> list[Obj]:
    return kustomize("k8s/overlays/dev")


def _by_key(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], HASH_SUFFIX.sub("", o["metadata"]["name"])): o for o in objs}


def test_generated_files_are_current() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in k8s_manifests.generate().items()
        if not path.exists() or path.read_text() != text
    ]
    assert not stale, f"stale: {stale}; run python -m tests.packaging.k8s_manifests"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_overlays_validate(base: list[Obj], dev: list[Obj], version: str) -> None:
    for obj in base + dev:
        validate_object(obj, version)


def _container_facts(c: Obj) -> dict[str, Any]:
    return {
        "image": c["image"],
        "args": c.get("args"),
        "ports": c.get("ports"),
        "probes": [c.get(k) for k in ("livenessProbe", "readinessProbe", "startupProbe")],
        "env": [e["name"] for e in c.get("env", [])],
        "mounts": c.get("volumeMounts"),
        "securityContext": c.get("securityContext"),
    }


def test_base_is_the_charts_default_install(base: list[Obj], default: Rendered) -> None:
    """Same objects, images, ports, probes, env names, mounts and selectors as `helm install`
    (but the Secrets: the site creates the tokens' Secret, k8s/base/kustomization.yaml)."""
    chart = {
        k: o
        for k, o in _by_key(default.own).items()
        if not default.is_hook(o)
        and o["kind"] != "Secret"
        and o["metadata"]["labels"].get("app.kubernetes.io/component")
        not in k8s_manifests.NOT_PLAIN
    }
    plain = _by_key(base)
    assert set(plain) == set(chart), f"only in k8s/: {set(plain) - set(chart)}; "
    for key, obj in plain.items():
        ours, theirs = obj, chart[key]
        labels = ours["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "kustomize", key
        for name, value in theirs["metadata"]["labels"].items():
            if name not in k8s_manifests.HELM_ONLY_LABELS:
                assert labels.get(name) == value, (key, name)
        if obj["kind"] == "ConfigMap":
            assert yaml.safe_load(ours["data"]["kelvin.yaml"]) == yaml.safe_load(
                theirs["data"]["kelvin.yaml"]
            )
        if obj["kind"] in ("Service", "PodDisruptionBudget", *WORKLOAD_KINDS):
            assert ours["spec"].get("selector") == theirs["spec"].get("selector"), key
        if obj["kind"] in WORKLOAD_KINDS:
            a, b = ours["spec"]["template"]["spec"], theirs["spec"]["template"]["spec"]
            assert [_container_facts(c) for c in containers(a)] == [
                _container_facts(c) for c in containers(b)
            ], key
            config = next(v for v in a["volumes"] if v["name"] == "config")["configMap"]["name"]
            assert HASH_SUFFIX.search(config), "pods must use the hashed ConfigMap name"


def test_workloads_read_the_tokens_from_the_sites_secret(base: list[Obj]) -> None:
    text = (ROOT / "k8s" / "base" / "kustomization.yaml").read_text()
    for key in ("read-token", "write-token", "admin-token"):
        assert f"--from-literal={key}=" in text, f"kustomization.yaml must say how to create {key}"
    for obj in base:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        for c in containers(obj["spec"]["template"]["spec"]):
            refs = {
                e["name"]: e["valueFrom"]["secretKeyRef"]
                for e in c.get("env", [])
                if e["name"].startswith("KELVIN_AUTH_")
            }
            assert set(refs) == {f"KELVIN_AUTH_{r}_TOKEN" for r in ("READ", "WRITE", "ADMIN")}
            assert {r["name"] for r in refs.values()} == {"kelvin"}, obj["metadata"]["name"]


def test_dev_overlay(dev: list[Obj]) -> None:
    objs = _by_key(dev)
    assert {o["metadata"].get("namespace") for o in dev if o["kind"] != "Namespace"} == {
        "kelvin-dev"
    }
    namespace = objs[("Namespace", "kelvin-dev")]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # The default config's storage URL, http://influxdb:8086, resolves in the overlay.
    influx = objs[("Service", "influxdb")]
    assert influx["spec"]["ports"][0]["port"] == 8086
    assert objs[("StatefulSet", "influxdb")]["spec"]["serviceName"] == "influxdb"
    assert objs[("StatefulSet", "kelvin-collect-agent")]["spec"]["replicas"] == 1
    for kind, name in [
        ("StatefulSet", "kelvin-collect-agent"),
        ("Deployment", "kelvin-query-api"),
        ("Deployment", "kelvin-allocator"),
        ("DaemonSet", "kelvin-pusher"),
    ]:
        (c,) = objs[(kind, name)]["spec"]["template"]["spec"]["containers"]
        assert c["image"] == "kelvin:dev"
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env["KELVIN_LOG_LEVEL"] == "DEBUG", name
        if name == "kelvin-pusher":
            assert "NODE_NAME" in env, "the patch must add to the env, not replace it"
