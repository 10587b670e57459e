"""The chart's credentials and network policies: secure with its defaults, no manual step.

Offline rendering has no cluster, so Helm's `lookup` finds no Secret and every render
generates new tokens (on a real `helm upgrade` it finds the release's Secret and keeps
them); what is checked here is that one render is consistent and never empty.
"""

from __future__ import annotations

import base64

import yaml

from services.common.auth import hashed
from tests.packaging.chart import ChartRenderer, Rendered

ROLES = ("read", "write", "admin")


def _tokens(r: Rendered) -> dict[str, str]:
    data = r.get("Secret", "kelvin")["data"]
    return {role: base64.b64decode(data[f"{role}-token"]).decode() for role in ROLES}


def _env(r: Rendered, component: str) -> dict[str, dict[str, object]]:
    (c,) = r.workload(component)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in c.get("env", [])}


def test_default_install_generates_three_distinct_random_tokens(default: Rendered) -> None:
    tokens = _tokens(default)
    assert len(set(tokens.values())) == 3
    for role, tok in tokens.items():
        assert len(tok) == 43 and tok.isalnum(), role


def test_every_template_of_one_render_sees_the_same_tokens(default: Rendered) -> None:
    tokens = _tokens(default)
    agent = _env(default, "collect-agent")
    for role in ROLES:
        assert agent[f"KELVIN_AUTH_{role.upper()}_TOKEN"]["value"] == hashed(tokens[role])
    pusher = _env(default, "pusher")
    assert pusher["KELVIN_AUTH_ADMIN_TOKEN"]["value"] == hashed(tokens["admin"]), "no node holds it"
    assert "KELVIN_PUSHER_TOKEN" not in pusher
    ds = default.get("Secret", "kelvin-grafana-datasource")["stringData"]
    (source,) = yaml.safe_load(ds["kelvin-datasource.yaml"])["datasources"]
    assert source["secureJsonData"]["httpHeaderValue1"] == f"Bearer {tokens['read']}"
    assert source["url"] == "http://kelvin-query-api.kelvin.svc:8080/prometheus"
    assert source["type"] == "prometheus" and source["uid"] == "kelvin"


def test_no_service_runs_open_or_with_an_empty_token(rendered: Rendered) -> None:
    cfg = yaml.safe_load(rendered.config_yaml())
    assert cfg["auth"]["mode"] == "token" and cfg["auth"]["open_reads"] is False
    for component in ("collect-agent", "query-api", "allocator", "pusher"):
        env = _env(rendered, component)
        for role in ROLES:
            item = env[f"KELVIN_AUTH_{role.upper()}_TOKEN"]
            assert item.get("value") or item.get("valueFrom"), (rendered.values_name, component)
    for secret in rendered.of_kind("Secret"):
        for key, value in secret.get("data", {}).items():
            assert base64.b64decode(value), f"{secret['metadata']['name']}: {key} is empty"


def test_network_policies_are_on_by_default(default: Rendered) -> None:
    names = {o["metadata"]["name"] for o in default.of_kind("NetworkPolicy")}
    assert names == {f"kelvin-{c}" for c in ("collect-agent", "query-api", "allocator", "pusher")}
    agent = default.get("NetworkPolicy", "kelvin-collect-agent")["spec"]["ingress"]
    sources = [
        {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]}
        for rule in agent
    ]
    # the other agents read /metrics (MQTT rebalancing counts their connections)
    assert sources == [{"query-api", "test", "collect-agent"}, {"pusher", "allocator"}], (
        "no one else reaches it"
    )
    pusher = default.get("NetworkPolicy", "kelvin-pusher")["spec"]
    assert pusher["ingress"] == [] and "Egress" in pusher["policyTypes"]


def test_the_slurm_bridge_gets_a_network_policy_that_names_its_peers(
    chart: ChartRenderer,
) -> None:
    bridge = {
        "enabled": True,
        "slurmrestdUrl": "http://slurm-ctl:6820",
        "jwt": {"value": "eyJhbGciOi"},
        "nodeNames": "n[01-40]",
        "wakePort": 8085,
    }
    ports = ["http", "wake"]
    open_ = chart.render({"slurmBridge": bridge}, "bridge-open")
    rules = open_.get("NetworkPolicy", "kelvin-slurm-bridge")["spec"]["ingress"]
    assert [(r["ports"][0]["port"], r["ports"][0]["protocol"]) for r in rules] == [
        ("http", "TCP"),
        ("wake", "UDP"),
    ]
    assert all("from" not in r for r in rules), "slurmctld's address is not known: any source"
    ctl = [{"ipBlock": {"cidr": "10.0.0.5/32"}}]
    shut = chart.render(
        {"slurmBridge": bridge, "networkPolicy": {"slurmBridgeFrom": ctl}}, "bridge-shut"
    )
    rules = shut.get("NetworkPolicy", "kelvin-slurm-bridge")["spec"]["ingress"]
    assert [r["ports"][0]["port"] for r in rules] == ports
    assert [r["from"] for r in rules] == [ctl, ctl]


def test_auth_mode_none_warns_in_notes_and_renders_no_tokens(chart: ChartRenderer) -> None:
    r = chart.render({"auth": {"mode": "none"}}, "insecure")
    assert "WARNINGS" in r.notes and 'auth.mode is "none"' in r.notes
    assert "anyone who can reach" in r.notes
    assert not [s for s in r.of_kind("Secret") if "read-token" in s.get("data", {})]
    assert "KELVIN_AUTH_READ_TOKEN" not in _env(r, "query-api")
    assert yaml.safe_load(r.config_yaml())["auth"]["mode"] == "none"


def test_notes_say_how_to_read_the_tokens(default: Rendered) -> None:
    assert "kubectl --namespace kelvin get secret kelvin -o jsonpath='{.data.admin-token}'" in (
        default.notes
    )
    assert "WARNINGS" not in default.notes.split("Credentials")[1].split("Query API")[0]
