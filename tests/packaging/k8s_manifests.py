"""The plain manifests under k8s/, generated from the chart so the two cannot drift.

`python -m tests.packaging.k8s_manifests` rewrites the generated files: k8s/base/
gets the chart's default install (one file per component, kelvin.yaml for the
ConfigMap generator), k8s/overlays/dev/ the bundled InfluxDB renamed `influxdb`
(the address the default config names). The kustomization.yaml files and the dev
overlay's patches are written by hand. A test fails when a generated file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.packaging.chart import CHART_DIR, RELEASE, ROOT, Obj, Rendered

BASE = ROOT / "k8s" / "base"
DEV = ROOT / "k8s" / "overlays" / "dev"
HEADER = (
    "# Generated from charts/kelvin by `python -m tests.packaging.k8s_manifests`: edit the\n"
    "# chart, not this file (a test compares the two).\n"
)
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
PLAIN_VALUES: dict[str, Any] = {
    "auth": {"existingSecret": RELEASE},
    "mqtt": {"builtin": {"nodeSecret": {"existingSecret": RELEASE}}},
}
"""Without Helm nothing can generate and keep tokens or the MQTT node secret: the
workloads read them from the Secret `kelvin` the site creates (k8s/base/kustomization.yaml
says how)."""
DEV_VALUES = {**PLAIN_VALUES, "influxdb": {"enabled": True, "persistence": {"enabled": False}}}


def _strip_labels(meta: Obj) -> None:
    labels = meta.get("labels") or {}
    for key in HELM_ONLY_LABELS:
        labels.pop(key, None)


def plain(obj: Obj) -> Obj:
    """`obj` without what only Helm uses: release namespace, Helm labels, checksums, hooks."""
    meta = obj["metadata"]
    meta.pop("namespace", None)
    _strip_labels(meta)
    annotations = meta.get("annotations") or {}
    annotations.pop("helm.sh/resource-policy", None)
    if not annotations:
        meta.pop("annotations", None)
    template = obj.get("spec", {}).get("template")
    if template:
        _strip_labels(template["metadata"])
        # kustomize's hashed ConfigMap name rolls the pods instead of a checksum.
        ann = template["metadata"].get("annotations") or {}
        for key in [k for k in ann if k.startswith("checksum/")]:
            del ann[key]
        if not ann:
            template["metadata"].pop("annotations", None)
    for claim in obj.get("spec", {}).get("volumeClaimTemplates", []):
        _strip_labels(claim["metadata"])
    return obj


def _dump(objs: list[Obj]) -> str:
    docs = [yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objs]
    return HEADER + "---\n".join(docs)


def _render(chart: Any, values: Obj) -> Rendered:
    return Rendered("k8s", values, chart.render(values, name=RELEASE, namespace=RELEASE))


NOT_PLAIN = ("dashboards", "collect-agent-janitor")
"""Components left out: Grafana's dashboards, and the spool janitor, whose drain Job
template (ConfigMap data) names the config ConfigMap, which kustomize renames with a hash."""


def generate() -> dict[Path, str]:
    """Generated file -> content."""
    with helm.Chart.load(CHART_DIR) as chart:
        base = _render(chart, PLAIN_VALUES)
        dev = _render(chart, DEV_VALUES)
    files: dict[Path, str] = {}
    by_file: dict[str, list[Obj]] = {}
    for obj in base.own:
        labels = obj["metadata"].get("labels", {})
        component = labels.get("app.kubernetes.io/component")
        if base.is_hook(obj) or obj["kind"] == "Secret" or component in NOT_PLAIN:
            continue
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == f"{RELEASE}-config":
            body = obj["data"]["kelvin.yaml"]
            files[BASE / "kelvin.yaml"] = HEADER + body
            continue
        by_file.setdefault(f"{component or obj['kind'].lower()}.yaml", []).append(plain(obj))
    for name, objs in by_file.items():
        files[BASE / name] = _dump(objs)
    influx = [plain(o) for o in dev.own if o["metadata"]["name"] == f"{RELEASE}-influxdb"]
    for obj in influx:
        obj["metadata"]["name"] = "influxdb"
        if obj["kind"] == "StatefulSet":
            obj["spec"]["serviceName"] = "influxdb"
    files[DEV / "influxdb.yaml"] = _dump(influx)
    return files


def main() -> int:
    for path, text in generate().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
