"""Render the Kelvin chart offline and walk what it renders.

Helm's own engine renders the chart (``helm-python-sdk`` embeds it as a library),
so no helm binary and no cluster are needed: what these helpers return is what
``helm template`` would print.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "kelvin"
CI_DIR = CHART_DIR / "ci"
RELEASE = "kelvin"
NAMESPACE = "kelvin"
COMPONENTS = ("pusher", "collect-agent", "query-api", "allocator", "slurm-bridge")
"""Kelvin's services, by their `kelvin run` name (= the `app.kubernetes.io/component` label)."""
OPTIONAL = {"pusher": ("pusher", True), "allocator": ("allocator", True),
            "slurm-bridge": ("slurmBridge", False)}  # fmt: skip
"""Components a values file may switch off: (values key, enabled by default)."""
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
K8S_VERSIONS = ("1.25.0", "1.30.0", kubernetes_validate.latest_version())
"""The oldest Kubernetes the chart supports (Chart.yaml kubeVersion), a middle one, the newest known."""

Obj = dict[str, Any]


def values_files() -> dict[str, Obj]:
    """The default values (``{}``) and every ``ci/*-values.yaml``, by short name."""
    out: dict[str, Obj] = {"default": {}}
    for path in sorted(CI_DIR.glob("*-values.yaml")):
        out[path.name.removesuffix("-values.yaml")] = yaml.safe_load(path.read_text()) or {}
    return out


@dataclass
class Rendered:
    """One rendering of the chart: its files and the Kubernetes objects in them."""

    values_name: str
    values: Obj
    files: dict[str, str]
    objects: list[Obj] = field(default_factory=list)
    """Every object, `extraObjects` (the user's own, rendered as given) last."""
    extra: list[Obj] = field(default_factory=list)

    def __post_init__(self) -> None:
        for path, text in sorted(self.files.items()):
            if path.endswith("NOTES.txt"):
                continue
            docs = [d for d in yaml.safe_load_all(text) if d]
            (self.extra if path.endswith("/extra-objects.yaml") else self.objects).extend(docs)
        self.objects.extend(self.extra)

    @property
    def own(self) -> list[Obj]:
        """The objects the chart itself makes (not `extraObjects`)."""
        return [o for o in self.objects if not any(o is e for e in self.extra)]

    @property
    def notes(self) -> str:
        return next((t for p, t in self.files.items() if p.endswith("NOTES.txt")), "")

    def of_kind(self, *kinds: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] in kinds]

    def get(self, kind: str, name: str) -> Obj:
        for o in self.of_kind(kind):
            if o["metadata"]["name"] == name:
                return o
        have = sorted(o["metadata"]["name"] for o in self.of_kind(kind))
        raise KeyError(f"{self.values_name}: no {kind} named {name!r}; rendered: {have}")

    def workload(self, component: str) -> Obj:
        """The workload running `component` (Deployment, StatefulSet or DaemonSet)."""
        found = [
            o
            for o in self.of_kind(*WORKLOAD_KINDS)
            if o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
            == component
        ]
        assert len(found) == 1, f"{self.values_name}: {len(found)} workloads for {component}"
        return found[0]

    def config_yaml(self) -> str:
        return str(self.get("ConfigMap", f"{RELEASE}-config")["data"]["kelvin.yaml"])

    def is_hook(self, obj: Obj) -> bool:
        return "helm.sh/hook" in (obj["metadata"].get("annotations") or {})


def is_enabled(rendered: Rendered, component: str) -> bool:
    """Whether ``rendered`` runs ``component`` (every component but the optional ones does)."""
    if component not in OPTIONAL:
        return True
    key, default = OPTIONAL[component]
    return bool(rendered.values.get(key, {}).get("enabled", default))


def pod_specs(rendered: Rendered) -> Iterator[tuple[Obj, Obj]]:
    """(owner object, pod spec) for every workload and bare Pod."""
    for obj in rendered.objects:
        if obj["kind"] in WORKLOAD_KINDS:
            yield obj, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield obj, obj["spec"]


def containers(spec: Obj, init: bool = False) -> list[Obj]:
    return list(spec.get("initContainers", []) if init else spec["containers"])


class ChartRenderer:
    """The chart loaded once; renderings cached by their values."""

    def __init__(self, chart_dir: Path = CHART_DIR) -> None:
        self.chart = helm.Chart.load(chart_dir)
        self._cache: dict[str, Rendered] = {}

    def render(self, values: Obj, name: str = "custom", release: str = RELEASE) -> Rendered:
        key = json.dumps([values, release], sort_keys=True)
        if key not in self._cache:
            files = self.chart.render(values, name=release, namespace=NAMESPACE)
            self._cache[key] = Rendered(name, values, files)
        return self._cache[key]

    def close(self) -> None:
        self.chart.close()
