"""The spool janitor in the chart: a CronJob running `kelvin spool orphans` in claims mode, with
its own least-privilege account, the drain Job it creates rendered once into a ConfigMap
(the same Job as the Helm hook's), and nothing of it in the emptyDir or shared modes."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from services.cli import build_parser
from tests.packaging.chart import CHART_DIR, RELEASE, ChartRenderer, Obj, Rendered

NAME = f"{RELEASE}-collect-agent-janitor"
STS = f"{RELEASE}-collect-agent"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
KINDS = ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "CronJob")


def janitor_objects(r: Rendered) -> list[tuple[str, str]]:
    return sorted(
        (o["kind"], o["metadata"]["name"])
        for o in r.objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        == "collect-agent-janitor"
    )


def pod_of(r: Rendered) -> Obj:
    spec: Obj = r.get("CronJob", NAME)["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def test_rendered_by_default_in_claims_mode(default: Rendered) -> None:
    assert janitor_objects(default) == sorted((k, NAME) for k in KINDS)
    cron = default.get("CronJob", NAME)["spec"]
    assert cron["schedule"] == "*/2 * * * *" and cron["concurrencyPolicy"] == "Forbid"
    pod = pod_of(default)
    (c,) = pod["containers"]
    args = build_parser().parse_args(c["args"])
    assert (args.command, args.spool_command, args.statefulset) == ("spool", "orphans", STS)
    default.get("StatefulSet", args.statefulset)  # the agents' StatefulSet, by that name
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert str(args.job_template.parent) == mounts["template"]
    cm = default.get("ConfigMap", volumes["template"]["configMap"]["name"])
    assert args.job_template.name in cm["data"]


def test_its_account_may_do_only_what_it_needs(default: Rendered) -> None:
    sa = default.get("ServiceAccount", NAME)
    assert sa["automountServiceAccountToken"] is False
    binding = default.get("RoleBinding", NAME)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": NAME}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "kelvin"}]
    granted = {
        (g, res, verb, tuple(rule.get("resourceNames", ())))
        for rule in default.get("Role", NAME)["rules"]
        for g in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("apps", "statefulsets", "get", (STS,)),
        ("", "persistentvolumeclaims", "list", ()),
        ("", "pods", "list", ()),
        ("batch", "jobs", "list", ()),
        ("batch", "jobs", "create", ()),
    }
    assert not default.of_kind("ClusterRole", "ClusterRoleBinding")
    # Kelvin's own account stays without any API access.
    bound = [b["subjects"] for b in default.of_kind("RoleBinding")]
    assert all(s["name"] == NAME for subjects in bound for s in subjects)


def test_its_pod_gets_a_short_lived_projected_token_and_runs_unprivileged(
    default: Rendered,
) -> None:
    pod = pod_of(default)
    assert pod["serviceAccountName"] == NAME and pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    (token_mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == SA_DIR]
    (vol,) = [v for v in pod["volumes"] if v["name"] == token_mount["name"]]
    sources = vol["projected"]["sources"]
    (token,) = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    assert token["path"] == "token" and token["expirationSeconds"] <= 3600
    paths = [i["path"] for s in sources for i in (s.get("configMap") or s.get("downwardAPI") or
             {}).get("items", [])]  # fmt: skip
    assert sorted(paths) == ["ca.crt", "namespace"], "what KubeApi.in_cluster reads"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["restartPolicy"] == "Never" and not c.get("resources"), "unset by default"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False


def test_the_job_it_creates_is_the_hook_drain_job(chart: ChartRenderer) -> None:
    r = chart.render({"collectAgent": {"spool": {"persistence": {"drainOrdinals": [3]}}}})
    hook = r.get("Job", f"{STS}-drain-3")
    template = json.loads(r.get("ConfigMap", NAME)["data"]["drain-job.json"])
    assert (
        template["spec"]["template"]["spec"]["containers"]
        == (hook["spec"]["template"]["spec"]["containers"])
    )
    for j in (hook, template):
        j["metadata"].pop("annotations", None)
        j["metadata"].pop("name")
        (spool,) = [v for v in j["spec"]["template"]["spec"]["volumes"] if v["name"] == "spool"]
        spool.pop("persistentVolumeClaim")
    assert template == hook, "the same Job but for its name, claim and hook annotations"


def test_the_schedule_is_configurable_and_checked(chart: ChartRenderer) -> None:
    values = {"collectAgent": {"spool": {"persistence": {"janitor": {"schedule": "*/5 * * * *"}}}}}
    r = chart.render(values)
    assert r.get("CronJob", NAME)["spec"]["schedule"] == "*/5 * * * *"
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values["collectAgent"]["spool"]["persistence"]["janitor"]["schedule"] = "every 2 minutes"
    with pytest.raises(jsonschema.ValidationError, match="every 2 minutes"):
        jsonschema.validate(values, schema)


@pytest.mark.parametrize(
    "values",
    [
        {"kind": "Deployment", "spool": {"persistence": {"enabled": False}}},  # emptyDir
        {"kind": "Deployment", "spool": {"shared": {"enabled": True}}},
        {"spool": {"shared": {"enabled": True}}},  # shared, as a StatefulSet
        {"spool": {"persistence": {"janitor": {"enabled": False}}}},
    ],
    ids=["emptyDir", "shared-deployment", "shared-statefulset", "disabled"],
)
def test_absent_outside_claims_mode(chart: ChartRenderer, values: dict[str, Any]) -> None:
    r = chart.render({"collectAgent": values})
    assert janitor_objects(r) == []


def _selects(policy: Obj, labels: dict[str, str]) -> bool:
    want = policy["spec"]["podSelector"].get("matchLabels", {})
    return all(labels.get(k) == v for k, v in want.items())


def test_network_policies_let_the_janitor_reach_the_api_server(chart: ChartRenderer) -> None:
    r = chart.render({"influxdb": {"enabled": True}})
    policies = r.of_kind("NetworkPolicy")
    assert policies, "network policies are on by default"
    labels = r.get("CronJob", NAME)["spec"]["jobTemplate"]["spec"]["template"]["metadata"]
    janitor_labels = labels["labels"]
    selecting = [p for p in policies if _selects(p, janitor_labels)]
    # None restricts its egress (only the pushers' does), so it reaches the API server
    # wherever the cluster serves it (443, 6443, a node address).
    for p in selecting:
        assert "Egress" not in p["spec"]["policyTypes"], p["metadata"]["name"]
    # the Jobs it creates reach the bundled InfluxDB (drain Jobs' label)
    (influx,) = [p for p in policies if p["metadata"]["name"] == f"{RELEASE}-influxdb"]
    sources = [
        s["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for rule in influx["spec"]["ingress"]
        for s in rule.get("from", [])
    ]
    template = json.loads(r.get("ConfigMap", NAME)["data"]["drain-job.json"])
    component = template["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    assert component in sources


def test_notes_warn_of_an_hpa_with_claims_only_without_the_janitor(chart: ChartRenderer) -> None:
    hpa = {"autoscaling": {"enabled": True}, "resources": {"requests": {"cpu": "500m"}}}
    assert "spool janitor off" not in chart.render({"collectAgent": hpa}).notes
    off = {**hpa, "spool": {"persistence": {"janitor": {"enabled": False}}}}
    assert "spool janitor off" in chart.render({"collectAgent": off}).notes
