"""The configuration each container gets is one Kelvin accepts, and the one intended.

For every values file, each Kelvin container's kelvin.yaml (the ConfigMap) and
environment (Secrets resolved, `$(VAR)` expanded as the kubelet does) are loaded
through the services' real settings classes: an unknown key, a wrong type or an
env name no setting reads fails here, not on a cluster. No cluster runs here, so
Secrets the user would create (existingSecret) come from EXISTING_SECRETS below.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from services.cli import SECTIONS
from services.common.auth import Role, hashed
from services.common.auth_settings import AuthSettings
from services.common.settings import Config, LoggingSettings, SectionSettings
from services.common.storage.settings import StorageSettings
from tests.packaging.chart import COMPONENTS, Obj, Rendered, containers, is_enabled

EXISTING_SECRETS = {
    "kelvin-broker": {
        "username": "agent",
        "password": 'br"oker\\pw',
        "publisher-username": "publisher",
        "publisher-password": "publisher-pw",
    },
    "kelvin-influxdb": {"influxdb-token": "influx-token-from-secret"},
    "kelvin-tokens": {
        "read-token": "site-read-token-0123456789",
        "write-token": "site-write-token-012345678",
        "admin-token": "site-admin-token-012345678",
    },
    "clickhouse-kelvin": {"user": "kelvin-ch", "password": "s3cret"},
}
"""Secrets the ci/ values files name as existingSecret, as a site would create them."""

SERVICE_SETTINGS = {c: f"services.{c.replace('-', '_')}.settings" for c in COMPONENTS}
STORAGE_USERS = {"collect-agent", "query-api"}


def settings_classes(component: str) -> list[type[SectionSettings]]:
    own: type[SectionSettings] = importlib.import_module(SERVICE_SETTINGS[component]).Settings
    classes: list[type[SectionSettings]] = [own, LoggingSettings, AuthSettings]
    if component in STORAGE_USERS:
        classes.append(StorageSettings)
    return classes


def container_env(rendered: Rendered, container: Obj) -> dict[str, str]:
    """The environment the kubelet would give `container`."""
    chart_secrets = {
        s["metadata"]["name"]: {
            **{k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()},
            **s.get("stringData", {}),
        }
        for s in rendered.of_kind("Secret")
    }
    store = {**EXISTING_SECRETS, **chart_secrets}
    env: dict[str, str] = {}
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = _expand(str(item["value"]), env)
            continue
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = store.get(ref["name"], {}).get(ref["key"])
            if value is None:
                assert ref.get("optional"), f"{name}: Secret {ref['name']} has no key {ref['key']}"
                continue
            env[name] = value
        elif "fieldRef" in source:
            env[name] = f"node-{source['fieldRef']['fieldPath']}"
    return env


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' dependent variables: $(VAR) of an earlier entry; $$ is a literal $."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        value,
    )


def load_settings(
    rendered: Rendered, component: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """Settings objects of `component` as its container would load them, by section."""
    spec = rendered.workload(component)["spec"]["template"]["spec"]
    (container,) = containers(spec)
    path = tmp_path / f"{component}.yaml"
    path.write_text(rendered.config_yaml())
    for key in [k for k in os.environ if k.startswith("KELVIN_")]:
        monkeypatch.delenv(key)
    for key, value in container_env(rendered, container).items():
        monkeypatch.setenv(key, value)
    cfg = Config(path)
    cfg.check_sections(SECTIONS)
    return {cls.section: cfg.load(cls) for cls in settings_classes(component)}


def _enabled(rendered: Rendered, component: str) -> bool:
    return is_enabled(rendered, component)


def test_every_service_loads_its_settings(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for component in COMPONENTS:
        if not _enabled(rendered, component):
            continue
        loaded = load_settings(rendered, component, tmp_path, monkeypatch)
        own = loaded[component.replace("-", "_")]
        assert own.host == "0.0.0.0"
        spec = rendered.workload(component)["spec"]["template"]["spec"]
        ports = {p["containerPort"] for p in spec["containers"][0]["ports"]}
        assert own.port in ports, f"{component} listens on {own.port}, not a container port"
        if component == "pusher":
            _validate_plugins(own, rendered.values_name)


def _validate_plugins(settings: Any, origin: str) -> None:
    """Each plugin section passes its plugin's own model (root paths, options)."""
    from services.pusher.config import plugin_sections, validate_section

    sections = plugin_sections(settings.plugins, "run")
    assert sections, "the pusher would run no plugin"
    for instance, section in sections.items():
        validate_section(instance, section, origin)


def test_paths_in_the_config_are_mounted(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every directory a service writes is a volume (the root filesystem is read-only)."""
    for component, field in [
        ("collect-agent", "spool_dir"),
        ("allocator", "state_dir"),
        ("pusher", "state_dir"),
    ]:
        if not _enabled(rendered, component):
            continue
        settings = load_settings(rendered, component, tmp_path, monkeypatch)
        directory = str(getattr(settings[component.replace("-", "_")], field))
        (c,) = rendered.workload(component)["spec"]["template"]["spec"]["containers"]
        writable = [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")]
        assert any(directory == p or directory.startswith(p + "/") for p in writable), (
            component,
            field,
        )


def test_env_names_are_settings_the_services_read(rendered: Rendered) -> None:
    """pydantic-settings ignores unknown KELVIN_* variables: a typo would be silent."""
    classes = {c for comp in COMPONENTS for c in settings_classes(comp)}
    for owner in rendered.of_kind("Deployment", "StatefulSet", "DaemonSet"):
        for c in containers(owner["spec"]["template"]["spec"]):
            for item in c.get("env", []):
                name = item["name"]
                if not name.startswith("KELVIN_") or name.startswith("KELVIN_SHARD_"):
                    continue
                assert any(_env_reaches_field(cls, name) for cls in classes), (
                    f"{owner['metadata']['name']}: {name} is read by no setting"
                )


def _env_reaches_field(cls: type[SectionSettings], name: str) -> bool:
    prefix = cls.env_prefix()
    if not name.startswith(prefix):
        return False
    model: Any = cls
    for part in name[len(prefix) :].lower().split("__"):
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return False
        annotation = fields[part].annotation
        model = next((a for a in (annotation, *typing.get_args(annotation)) if _is_model(a)), None)
    return True


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def test_no_secret_lands_in_the_configmap(rendered: Rendered) -> None:
    text = rendered.config_yaml()
    for secret in rendered.of_kind("Secret"):
        for key, encoded in secret.get("data", {}).items():
            value = base64.b64decode(encoded).decode()
            if key.endswith("-users"):
                values = list(json.loads(value).values())
            elif key.endswith(("password", "token")):
                values = [value]
            else:
                continue  # user names are not secret
            for v in values:
                assert v not in text, f"the value of {key} is in kelvin.yaml"
    for word in ("password", "token", "mqtt_users", "api_token"):
        assert not re.search(rf"^\s*{word}:", text, re.M), f"{word} in kelvin.yaml"


def test_default_install_wires_the_services_together(
    default: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = "kelvin-collect-agent"
    pusher = load_settings(default, "pusher", tmp_path, monkeypatch)["pusher"]
    assert pusher.brokers == [f"{agent}:1883"]
    assert pusher.allocator_url == "http://kelvin-allocator:8083"
    query = load_settings(default, "query-api", tmp_path, monkeypatch)
    assert query["query_api"].collect_agent_url == f"http://{agent}:8081"
    assert query["storage"].backend == "influxdb"
    assert query["storage"].influxdb.url == "http://influxdb:8086"
    allocator = load_settings(default, "allocator", tmp_path, monkeypatch)["allocator"]
    assert allocator.brokers == [f"{agent}:1883"]
    assert allocator.query_api_url == "http://kelvin-query-api:8080"
    agent_settings = load_settings(default, "collect-agent", tmp_path, monkeypatch)
    assert agent_settings["collect_agent"].mqtt_enabled is True
    assert agent_settings["collect_agent"].broker is None
    # Sensors are named after the node, not the pod; plugins read the node's /proc and /sys.
    assert pusher.node_prefix == "/node-spec.nodeName"
    assert pusher.plugins == {
        "procfs": {"root": "/host/proc"},
        "sysfs": {"root": "/host/sys", "rapl": False},
    }


def test_everything_reaches_the_services(
    everything: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    query = load_settings(everything, "query-api", tmp_path, monkeypatch)
    assert query["auth"].allowed_origins == ["https://grafana.example.org"]
    assert {"kelvin.hpc.example.org", ".internal.example.org"} <= set(query["auth"].allowed_hosts)
    influx = query["storage"].influxdb
    assert influx.url == "http://kelvin-influxdb:8086"
    assert (influx.username, influx.password, influx.token) == ("kelvin", "influx-password", None)
    assert influx.retention_policy == "two_years"
    assert query["logging"].level == "INFO", "`config` is merged over the values"
    agent = load_settings(everything, "collect-agent", tmp_path, monkeypatch)["collect_agent"]
    assert agent.mqtt_users == {"pusher": "pusher-password", "dcdb": "dcdb-password"}
    assert agent.cache_window_s == 1800
    (c,) = everything.workload("collect-agent")["spec"]["template"]["spec"]["containers"]
    tls_dir = str(Path(str(agent.mqtt_tls_cert)).parent)
    assert tls_dir in {m["mountPath"] for m in c["volumeMounts"]}
    pusher = load_settings(everything, "pusher", tmp_path, monkeypatch)["pusher"]
    assert pusher.auth_reads is True
    assert (pusher.mqtt_username, pusher.mqtt_password) == ("pusher", "pusher-password")
    assert pusher.prefix == "/hpc/node-spec.nodeName" and pusher.format == "dcdb"
    assert pusher.plugins is not None
    assert pusher.plugins["sysfs"] == {"root": "/host/sys", "hwmon": False, "rapl": True}
    assert pusher.plugins["rack-temperatures"]["rapl"] is False, "an explicit rapl wins"
    allocator = load_settings(everything, "allocator", tmp_path, monkeypatch)["allocator"]
    assert allocator.min_mttf_years == 5
    assert (allocator.mqtt_username, allocator.mqtt_password) == ("pusher", "pusher-password")
    (c,) = everything.workload("allocator")["spec"]["template"]["spec"]["containers"]
    assert str(allocator.hall_file) == "/etc/kelvin-hall/hall.yaml"
    assert "/etc/kelvin-hall" in {m["mountPath"] for m in c["volumeMounts"]}
    volumes = everything.workload("allocator")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "hall", "configMap": {"name": "kelvin-hall"}} in volumes
    assert influx.retention_duration == "104w"


def _chart_tokens(rendered: Rendered) -> dict[Role, str]:
    data = rendered.get("Secret", "kelvin")["data"]
    return {r: base64.b64decode(data[f"{r.value}-token"]).decode() for r in Role}


def test_generated_tokens_reach_every_service_as_it_needs_them(
    default: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each service checks all three roles; only what it sends is in plain, the rest are
    sha256 verifiers (a pusher on a compute node never holds the admin token)."""
    tokens = _chart_tokens(default)
    assert len(set(tokens.values())) == 3 and all(len(t) >= 40 for t in tokens.values())
    sends = {
        "query-api": {Role.READ},
        "allocator": {Role.READ},
        "collect-agent": set(),
        "pusher": set(),
    }
    for component, plain in sends.items():
        auth = load_settings(default, component, tmp_path, monkeypatch)["auth"]
        assert auth.mode == "token" and auth.open_reads is False, component
        for role in Role:
            given = getattr(auth, f"{role.value}_token")
            want = tokens[role] if role in plain else hashed(tokens[role])
            assert given == want, (component, role)
        creds = auth.to_config()
        assert creds.allowed_hosts is not None and f"kelvin-{component}" in creds.allowed_hosts
    test_pod = default.get("Pod", "kelvin-test-query-api")
    env = container_env(default, test_pod["spec"]["containers"][0])
    assert env["KELVIN_AUTH_READ_TOKEN"] == tokens[Role.READ], "helm test reads with the token"
    assert "KELVIN_AUTH_ADMIN_TOKEN" not in env


def test_an_existing_secret_gives_every_service_its_tokens(
    chart_values: dict[str, Rendered], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = chart_values["external-broker"]
    site = EXISTING_SECRETS["kelvin-tokens"]
    assert not [s for s in rendered.of_kind("Secret") if "read-token" in s.get("data", {})]
    for component in COMPONENTS:
        if not _enabled(rendered, component):
            continue
        auth = load_settings(rendered, component, tmp_path, monkeypatch)["auth"]
        assert (auth.read_token, auth.write_token, auth.admin_token) == (
            site["read-token"],
            site["write-token"],
            site["admin-token"],
        ), component


def test_external_broker_mode(
    chart_values: dict[str, Rendered], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = chart_values["external-broker"]
    agent = load_settings(rendered, "collect-agent", tmp_path, monkeypatch)["collect_agent"]
    assert agent.mqtt_enabled is False
    broker = agent.broker
    assert broker is not None
    assert (broker.host, broker.port, broker.tls, broker.group) == (
        "emqx.mqtt.svc",
        8883,
        True,
        "kelvin-ingest",
    )
    assert (broker.username, broker.password) == ("agent", 'br"oker\\pw')
    assert broker.prefixes == ["/dc", "/facility"] and broker.session_expiry_s == 7200
    assert agent.spool_max_bytes == 8589934592
    pusher = load_settings(rendered, "pusher", tmp_path, monkeypatch)["pusher"]
    assert pusher.brokers == ["emqx.mqtt.svc:8883"]
    assert (pusher.mqtt_username, pusher.mqtt_password) == ("publisher", "publisher-pw")
    allocator = load_settings(rendered, "allocator", tmp_path, monkeypatch)["allocator"]
    assert allocator.brokers == ["emqx.mqtt.svc:8883"]
    assert (allocator.mqtt_username, allocator.mqtt_password) == ("publisher", "publisher-pw")
    storage = load_settings(rendered, "query-api", tmp_path, monkeypatch)["storage"]
    assert storage.influxdb.token == "influx-token-from-secret"
    assert storage.influxdb.username is None, "optional keys missing from the Secret stay unset"
    svc = rendered.get("Service", "kelvin-collect-agent")
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http"], "no MQTT port in external mode"


def test_clickhouse_cluster_storage_with_credentials_from_a_secret(
    chart_values: dict[str, Rendered], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = chart_values["clickhouse-storage"]
    for component in ("collect-agent", "query-api"):
        storage = load_settings(rendered, component, tmp_path, monkeypatch)["storage"]
        assert storage.backend == "clickhouse"
        ch = storage.clickhouse
        assert len(ch.urls) == 4 and ch.urls[0].startswith("http://chi-kelvin-kelvin-0-0")
        assert (ch.cluster, ch.insert_quorum, ch.raw_ttl_s) == ("kelvin", 2, 7776000)
        assert (ch.username, ch.password) == ("kelvin-ch", "s3cret")
    deployment = rendered.get("Deployment", "kelvin-query-api")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    password = next(e for e in env if e["name"] == "KELVIN_STORAGE_CLICKHOUSE__PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {
        "name": "clickhouse-kelvin",
        "key": "password",
        "optional": True,
    }


@pytest.fixture(scope="session")
def chart_values(chart: Any) -> dict[str, Rendered]:
    from tests.packaging.conftest import VALUES

    return {name: chart.render(values, name) for name, values in VALUES.items()}


def test_the_slurm_bridge_gets_its_secrets_and_the_allocator_follows_slurm(
    everything: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bridge = load_settings(everything, "slurm-bridge", tmp_path, monkeypatch)["slurm_bridge"]
    assert bridge.slurmrestd_url == "http://slurm-ctl.example.org:6820"
    assert bridge.notify_token == "notify-token" and bridge.allocator_token is None
    env = {
        e["name"]
        for e in containers(everything.workload("slurm-bridge")["spec"]["template"]["spec"])[0][
            "env"
        ]
    }
    assert "KELVIN_AUTH_ADMIN_TOKEN" in env  # the admin token it sends to the allocator
    assert bridge.allocator_url == "http://kelvin-allocator:8083"
    assert bridge.node_names == "n[01-40]" and bridge.partitions == ["kelvin"]
    (c,) = everything.workload("slurm-bridge")["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert str(bridge.jwt_key_file.parent) in mounts and bridge.token_file is None
    allocator = load_settings(everything, "allocator", tmp_path, monkeypatch)["allocator"]
    assert allocator.cluster == "external"
