"""The Tiltfile, executed against stand-ins for Tilt's functions (no tilt or cluster here).

Starlark is a subset of Python, so the Tiltfile runs as Python with recording
stubs; `helm()` renders the chart with Helm's engine and the same `--set` flags,
so resource names, ports and image refs are checked against what Tilt would deploy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.packaging.chart import CHART_DIR, ROOT, WORKLOAD_KINDS, Obj
from tests.packaging.dockerfile import parse

TILTFILE = ROOT / "Tiltfile"


def _merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    """Helm's layering of -f files and --set: later wins, maps merge."""
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value)
        else:
            dst[key] = value


@dataclass
class Tilt:
    """What the Tiltfile asked Tilt to do."""

    builds: list[dict[str, Any]] = field(default_factory=list)
    objects: list[Obj] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    helm_calls: list[dict[str, Any]] = field(default_factory=list)

    def api(self) -> dict[str, Any]:
        tilt = self

        class Config:
            def define_string_list(self, name: str, usage: str = "", args: bool = False) -> None:
                pass

            def parse(self) -> dict[str, Any]:
                return {}

        def docker_build(ref: str, context: str, **kw: Any) -> None:
            tilt.builds.append({"ref": ref, "context": context, **kw})

        def helm_(path: str, **kw: Any) -> str:
            tilt.helm_calls.append({"path": path, **kw})
            values: dict[str, Any] = {}
            for f in kw.get("values", []):
                _merge(values, yaml.safe_load((ROOT / f).read_text()))
            _merge(values, helm.parse_set_string(",".join(kw.get("set", []))))
            with helm.Chart.load(ROOT / path) as chart:
                files = chart.render(values, name=kw["name"], namespace=kw["namespace"])
            return "\n---\n".join(t for p, t in sorted(files.items()) if not p.endswith(".txt"))

        def filter_yaml(
            text: str, labels: dict[str, str] | None = None, **kw: Any
        ) -> tuple[str, str]:
            docs = [d for d in yaml.safe_load_all(text) if d]
            hit = [
                d
                for d in docs
                if all(
                    d["metadata"].get("labels", {}).get(k) == v for k, v in (labels or {}).items()
                )
            ]
            rest = [d for d in docs if d not in hit]
            return yaml.safe_dump_all(hit), yaml.safe_dump_all(rest)

        def k8s_yaml(text: str) -> None:
            tilt.objects.extend(d for d in yaml.safe_load_all(text) if d)

        def k8s_resource(workload: str = "", **kw: Any) -> None:
            tilt.resources.append({"workload": workload, **kw})

        return {
            "config": Config(),
            "docker_build": docker_build,
            "helm": helm_,
            "filter_yaml": filter_yaml,
            "k8s_yaml": k8s_yaml,
            "k8s_resource": k8s_resource,
            "blob": lambda s: s,
            "sync": lambda local, remote: ("sync", local, remote),
            "fall_back_on": lambda files: ("fall_back_on", files),
            "port_forward": lambda local, container=None, name="", link_path="": {
                "local": local,
                "container": container or local,
                "name": name,
            },
        }


@pytest.fixture(scope="module")
def tilt() -> Tilt:
    recorded = Tilt()
    code = compile(TILTFILE.read_text(), str(TILTFILE), "exec")
    exec(code, recorded.api())
    return recorded


def _workloads(tilt: Tilt) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in tilt.objects if o["kind"] in WORKLOAD_KINDS}


def test_image_is_built_for_live_update(tilt: Tilt) -> None:
    (build,) = tilt.builds
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["image"]
    assert build["ref"] == f"{values['registry']}/{values['repository']}"
    _, stages = parse(ROOT / build["dockerfile"])
    assert build["target"] in {s.name for s in stages}
    dev = next(s for s in stages if s.name == build["target"])
    runtime = next(s for s in stages if s.name == dev.base)
    package_dir = runtime.env()["KELVIN_PACKAGE_DIR"]
    steps = build["live_update"]
    assert ("sync", "services", package_dir) in steps
    assert steps[0] == ("fall_back_on", ["pyproject.toml"]), "fall_back_on must come first"
    assert set(build["only"]) >= {"pyproject.toml", "README.md", "services"}


def test_every_kelvin_container_uses_the_built_image_writably(tilt: Tilt) -> None:
    ref = tilt.builds[0]["ref"]
    kelvin = [
        c
        for w in _workloads(tilt).values()
        for c in w["spec"]["template"]["spec"]["containers"]
        if c["image"].startswith(ref + ":")
    ]
    assert {c["name"] for c in kelvin} == {"pusher", "collect-agent", "query-api", "allocator"}
    for c in kelvin:
        assert c["securityContext"]["readOnlyRootFilesystem"] is False, "live_update writes files"
        assert "command" not in c, "the dev entrypoint (kelvin-dev) must wrap the args"


def test_resources_name_real_workloads_grouped_by_service(tilt: Tilt) -> None:
    workloads = _workloads(tilt)
    configured = {r["workload"]: r for r in tilt.resources if r["workload"]}
    assert set(configured) == set(workloads), "every workload gets a labelled resource"
    names = set(configured) | {r["new_name"] for r in tilt.resources if r.get("new_name")}
    for name, resource in configured.items():
        component = workloads[name]["metadata"]["labels"]["app.kubernetes.io/component"]
        assert resource["labels"] == [component if component != "influxdb" else "storage"]
        for dep in resource.get("resource_deps", []):
            assert dep in names, f"{name} depends on unknown resource {dep}"


def test_every_object_belongs_to_a_resource(tilt: Tilt) -> None:
    """Workloads and the Services selecting them are grouped by Tilt; the rest by `objects`."""
    listed = {o for r in tilt.resources for o in r.get("objects", [])}
    templates = [w["spec"]["template"]["metadata"]["labels"] for w in _workloads(tilt).values()]
    for obj in tilt.objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        assert kind != "Pod", "the helm test pod must not be deployed"
        if kind in WORKLOAD_KINDS:
            continue
        if kind == "Service" and any(
            all(t.get(k) == v for k, v in obj["spec"]["selector"].items()) for t in templates
        ):
            continue
        assert f"{name}:{kind.lower()}" in listed, f"{kind}/{name} would be uncategorized"
    for selector in listed:
        name, kind = selector.split(":")
        assert any(
            o["metadata"]["name"] == name and o["kind"].lower() == kind for o in tilt.objects
        ), f"objects= names {selector}, which is not deployed"


def test_port_forwards_reach_container_ports(tilt: Tilt) -> None:
    workloads = _workloads(tilt)
    forwarded: dict[int, str] = {}
    for r in tilt.resources:
        for pf in r.get("port_forwards", []):
            ports = {
                p["containerPort"]
                for c in workloads[r["workload"]]["spec"]["template"]["spec"]["containers"]
                for p in c.get("ports", [])
            }
            assert pf["container"] in ports, (
                f"{r['workload']}: nothing listens on {pf['container']}"
            )
            forwarded[pf["local"]] = r["workload"]
    assert forwarded[8080] == "kelvin-query-api"
    assert forwarded[8083] == "kelvin-allocator"
    assert forwarded[1883] == "kelvin-collect-agent"


def test_chart_is_deployed_through_helm(tilt: Tilt) -> None:
    (call,) = tilt.helm_calls
    assert Path(call["path"]) == CHART_DIR.relative_to(ROOT)
    assert call["name"] == "kelvin"
    namespace = next(o for o in tilt.objects if o["kind"] == "Namespace")
    assert call["namespace"] == namespace["metadata"]["name"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
