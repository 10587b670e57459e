"""The chart review checklist (prometheus-community REVIEW_GUIDELINES, Helm best practices).

Labels and selectors, probes, security contexts, images, defaults that cost
cluster resources, Chart.yaml metadata, lint, NOTES and README.
"""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.packaging.chart import (
    CHART_DIR,
    COMPONENTS,
    RELEASE,
    WORKLOAD_KINDS,
    ChartRenderer,
    Obj,
    Rendered,
    containers,
    is_enabled,
    pod_specs,
)
from tests.packaging.conftest import VALUES

RECOMMENDED = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version")
SELECTOR_KEYS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
}
SEMVER = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_every_object_has_the_recommended_labels(rendered: Rendered) -> None:
    for obj in rendered.own:
        labels = obj["metadata"].get("labels") or {}
        where = f"{rendered.values_name}: {obj['kind']}/{obj['metadata']['name']}"
        for key in (*RECOMMENDED, "helm.sh/chart", "app.kubernetes.io/managed-by"):
            assert labels.get(key), f"{where} lacks label {key}"
        assert labels["app.kubernetes.io/instance"] == RELEASE


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_names_are_valid_dns_labels(rendered: Rendered) -> None:
    """Kubernetes refuses other names; Services (and most objects here) need DNS-1123 labels."""
    for obj in rendered.objects:
        name = obj["metadata"]["name"]
        assert DNS_LABEL.match(name) and len(name) <= 63, f"{obj['kind']}/{name}"


def test_dashboards_are_configmaps_for_the_grafana_sidecar(everything: Rendered) -> None:
    import json

    files = sorted(p.name for p in (CHART_DIR / "dashboards").glob("*.json"))
    maps = [
        o
        for o in everything.of_kind("ConfigMap")
        if "grafana_dashboard" in o["metadata"].get("labels", {})
    ]
    assert sorted(k for m in maps for k in m["data"]) == files and files
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["namespace"] == "grafana"
        assert m["metadata"]["annotations"] == {"grafana_folder": "Kelvin"}
        for text in m["data"].values():
            assert json.loads(text)["title"]


def test_selectors_are_stable_and_select_their_pods(rendered: Rendered) -> None:
    """matchLabels: name, instance, component; never the chart version (immutable on upgrade)."""
    for obj in rendered.of_kind(*WORKLOAD_KINDS):
        selector = obj["spec"]["selector"]["matchLabels"]
        where = f"{rendered.values_name}: {obj['kind']}/{obj['metadata']['name']}"
        assert set(selector) == SELECTOR_KEYS, f"{where}: selector {selector}"
        assert _matches(selector, obj["spec"]["template"]["metadata"]["labels"]), where
    for obj in rendered.of_kind("Service", "PodDisruptionBudget", "NetworkPolicy"):
        spec = obj["spec"]
        selector = spec.get("selector") or spec.get("podSelector") or {}
        selector = selector.get("matchLabels", selector)
        assert not {"helm.sh/chart", "app.kubernetes.io/version"} & set(selector), obj


def test_each_service_selects_one_workload_and_its_named_ports(rendered: Rendered) -> None:
    templates = [o["spec"]["template"] for o in rendered.of_kind(*WORKLOAD_KINDS)]
    for svc in rendered.of_kind("Service"):
        chosen = [
            t for t in templates if _matches(svc["spec"]["selector"], t["metadata"]["labels"])
        ]
        where = f"{rendered.values_name}: Service/{svc['metadata']['name']}"
        assert len(chosen) == 1, f"{where} selects {len(chosen)} workloads"
        names = {p["name"] for c in chosen[0]["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in names, f"{where}: targetPort {port['targetPort']}"


def test_every_container_has_liveness_and_readiness_probes(rendered: Rendered) -> None:
    """Init containers and the `helm test` pod (a one-shot check) have none by nature."""
    for owner, spec in pod_specs(rendered):
        if rendered.is_hook(owner):
            continue
        for c in containers(spec):
            where = f"{rendered.values_name}: {owner['metadata']['name']}/{c['name']}"
            ports = {p["name"] for p in c.get("ports", [])}
            for kind in ("livenessProbe", "readinessProbe"):
                probe = c.get(kind)
                assert probe, f"{where} has no {kind}"
                if "httpGet" in probe:
                    assert probe["httpGet"]["port"] in ports, f"{where}: {kind} port"
            if c["name"] in COMPONENTS:
                assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", where
                assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", where


def test_kelvin_containers_run_kelvin_run_component(rendered: Rendered) -> None:
    """The image's entrypoint is `kelvin`; the args pick the service and the config file."""
    from services.cli import build_parser

    for component in COMPONENTS:
        if not is_enabled(rendered, component):
            continue
        (c,) = containers(rendered.workload(component)["spec"]["template"]["spec"])
        assert "command" not in c, "command would bypass the image's entrypoint (kelvin)"
        args = build_parser().parse_args(c["args"])
        assert (args.command, args.service) == ("run", component)
        assert str(args.config) == "/etc/kelvin/kelvin.yaml"


def test_pods_run_as_non_root_with_read_only_root(rendered: Rendered) -> None:
    for owner, spec in pod_specs(rendered):
        where = f"{rendered.values_name}: {owner['metadata']['name']}"
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, where
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
        assert spec["automountServiceAccountToken"] is False, where
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, f"{where}/{c['name']}"
            assert sc["readOnlyRootFilesystem"] is True, f"{where}/{c['name']}"
            assert sc["capabilities"]["drop"] == ["ALL"], f"{where}/{c['name']}"
            assert "add" not in sc["capabilities"] and not sc.get("privileged"), where
        for c in containers(spec, init=True):
            sc = c["securityContext"]
            if c["name"] == "mqtt-credentials":  # as unprivileged as the main containers
                assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"]
                assert sc["allowPrivilegeEscalation"] is False, f"{where}/{c['name']}"
                continue
            # The pusher's node-setup step is the one root container: CHOWN, and FOWNER
            # to chmod the state directory once it is the pusher's (test_pusher_node_setup).
            assert c["name"] == "node-setup", f"{where}: unexpected init container {c['name']}"
            state = rendered.values.get("pusher", {}).get("stateHostPath")
            caps = ["CHOWN", "FOWNER"] if state else ["CHOWN"]
            assert sc["capabilities"] == {"drop": ["ALL"], "add": caps}, where
            assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged"), where


def test_resources_are_unset_by_default(default: Rendered) -> None:
    for owner, spec in pod_specs(default):
        for c in containers(spec) + containers(spec, init=True):
            assert not c.get("resources"), f"{owner['metadata']['name']}/{c['name']}"


def test_resources_are_passed_through_when_set(everything: Rendered) -> None:
    (c,) = everything.workload("collect-agent")["spec"]["template"]["spec"]["containers"]
    assert c["resources"] == VALUES["everything"]["collectAgent"]["resources"]


def test_images_are_pinned(rendered: Rendered) -> None:
    for owner, spec in pod_specs(rendered):
        for c in containers(spec) + containers(spec, init=True):
            image = c["image"]
            where = f"{rendered.values_name}: {owner['metadata']['name']}/{c['name']}: {image}"
            name, _, digest = image.partition("@")
            tag = name.rsplit("/", 1)[-1].partition(":")[2]
            assert digest or tag, f"{where} has neither tag nor digest"
            assert tag != "latest", where
            assert c["imagePullPolicy"] == "IfNotPresent", where


def test_latest_tag_is_refused_with_a_clear_message(chart: ChartRenderer) -> None:
    with pytest.raises(helm.HelmError, match=r'tag "latest" is refused'):
        chart.render({"queryApi": {"image": {"tag": "latest"}}})


def test_pusher_mounts_the_host_read_only(rendered: Rendered) -> None:
    if not rendered.values.get("pusher", {}).get("enabled", True):
        return
    spec = rendered.workload("pusher")["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert {"/proc", "/sys"} <= set(host.values())
    for c in containers(spec):
        for m in c["volumeMounts"]:
            if m["name"] in host and host[m["name"]] in ("/proc", "/sys"):
                assert m.get("readOnly") is True, f"{c['name']} mounts {host[m['name']]} writable"
    tolerations = spec["tolerations"]
    assert {"operator": "Exists"} in tolerations, "the pusher must tolerate every taint"


def test_pusher_options_render(everything: Rendered) -> None:
    spec = everything.workload("pusher")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["priorityClassName"] == "system-node-critical"
    (setup,) = spec["initContainers"]
    script = setup["args"][0]
    assert "energy_uj" in script and "chgrp 10001" in script and "chmod g+r" in script
    assert "a+r" not in script, "RAPL counters must not become world-readable (PLATYPUS)"
    assert "chown 10001:10001 /host/pusher-state" in script


def test_features_needing_cluster_resources_are_off_by_default(default: Rendered) -> None:
    kinds = {o["kind"] for o in default.objects}
    for kind in ("Ingress", "HorizontalPodAutoscaler", "Job"):
        assert kind not in kinds, f"{kind} rendered by default"
    assert not default.of_kind("ServiceMonitor", "PodMonitor")
    # Persisted by default: the allocator's placements and the collect agents' spools
    # (what they acknowledged), nothing else (no bundled InfluxDB StatefulSet).
    claims = [o["metadata"]["name"] for o in default.of_kind("PersistentVolumeClaim")]
    assert claims == [f"{RELEASE}-allocator-state"]
    (sts,) = default.of_kind("StatefulSet")
    assert sts["metadata"]["name"] == f"{RELEASE}-collect-agent"
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["spool"]


def test_scaling_command_of_the_docs_names_a_real_workload(default: Rendered) -> None:
    """`kubectl scale statefulset/kelvin-collect-agent --replicas=5` with release `kelvin`."""
    sts = default.get("StatefulSet", "kelvin-collect-agent")
    assert "replicas" in sts["spec"]
    assert "kubectl --namespace kelvin scale statefulset/kelvin-collect-agent" in default.notes


def test_autoscaling_owns_the_replica_count(everything: Rendered) -> None:
    deployment = everything.get("Deployment", "kelvin-collect-agent")
    assert "replicas" not in deployment["spec"], "an HPA-managed Deployment must not pin replicas"
    (hpa,) = everything.of_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "kelvin-collect-agent",
    }
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_allocator_is_single_with_recreate_and_persisted_state(rendered: Rendered) -> None:
    if not rendered.values.get("allocator", {}).get("enabled", True):
        return
    d = rendered.workload("allocator")
    assert d["kind"] == "Deployment" and d["spec"]["replicas"] == 1
    assert d["spec"]["strategy"] == {"type": "Recreate"}
    volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
    assert "persistentVolumeClaim" in volumes["state"]


def test_chart_yaml_metadata() -> None:
    meta: dict[str, Any] = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == CHART_DIR.name
    assert SEMVER.match(meta["version"]) and int(meta["version"].split(".")[0]) >= 1
    for key in ("appVersion", "description", "kubeVersion", "home", "sources", "keywords"):
        assert meta.get(key), f"Chart.yaml lacks {key}"
    assert all(m.get("name") and m.get("url") for m in meta["maintainers"])


@pytest.mark.parametrize("values_name", sorted(VALUES))
def test_helm_lint_strict_is_clean(values_name: str) -> None:
    for version in ("v1.25.0", "v1.30.0"):
        report = helm.lint(CHART_DIR, VALUES[values_name], strict=True, kube_version=version)
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, f"{values_name} on {version}: {problems}"


def test_notes_and_readme(default: Rendered, everything: Rendered) -> None:
    assert "port-forward service/kelvin-query-api 8080" in default.notes
    assert "https://kelvin.example.org/" in everything.notes
    readme = (CHART_DIR / "README.md").read_text()
    assert "## Upgrading" in readme and "helm install" in readme


def test_package_keeps_templates_tests_and_drops_ci(tmp_path: Any) -> None:
    import tarfile

    archive = helm.package(CHART_DIR, destination=tmp_path)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "kelvin/templates/tests/test-query-api.yaml" in names
    assert not [n for n in names if n.startswith(("kelvin/ci/", "kelvin/tests/"))]


def _workload_named(rendered: Rendered, name: str) -> Obj:
    for obj in rendered.of_kind(*WORKLOAD_KINDS):
        if obj["metadata"]["name"] == name:
            return obj
    raise KeyError(name)


def test_config_changes_roll_the_pods(chart: ChartRenderer) -> None:
    """A pod-template checksum changes with kelvin.yaml, so `helm upgrade` restarts the pods."""
    a = chart.render({})
    b = chart.render({"logging": {"level": "DEBUG"}})
    for name in ("kelvin-query-api", "kelvin-collect-agent", "kelvin-pusher", "kelvin-allocator"):
        ann_a = _workload_named(a, name)["spec"]["template"]["metadata"]["annotations"]
        ann_b = _workload_named(b, name)["spec"]["template"]["metadata"]["annotations"]
        assert ann_a["checksum/config"] != ann_b["checksum/config"], name
