"""The chart's MQTT security end to end: the rendered configuration, run for real.

A collect agent runs with the settings and environment the chart gives its
container, the certificate the chart generated and the node secret of the
chart's Secret; the pusher's init container command writes its node's password;
then the pusher's and the allocator's rendered settings (TLS, CA, user, password
file) connect real clients (aiomqtt, and the allocator's own publisher) over TLS.
No cluster runs here, so the Service name the clients dial resolves to loopback.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import yaml

from services.allocator.metrics import AllocatorMetrics
from services.allocator.publisher import DecisionPublisher
from services.collect_agent.app import CollectAgent
from services.common import codec
from services.common.mqtt_credentials import client_tls, read_password
from services.common.settings import Config
from tests.packaging.chart import ChartRenderer, Rendered, containers
from tests.packaging.test_chart_config import _expand, container_env, load_settings
from tests.support.servers import require_binary

TLS = {"mqtt": {"builtin": {"tls": {"enabled": True, "generate": True}}}}
SERVICE = "kelvin-collect-agent"
TS0 = 1_764_500_000_000_000_000


def chart_secret(rendered: Rendered, name: str) -> dict[str, str]:
    s = rendered.get("Secret", name)
    return {k: base64.b64decode(v).decode() for k, v in s["data"].items()}


def test_default_credentials_stay_out_of_the_publishers(default: Rendered) -> None:
    secret = chart_secret(default, "kelvin")["mqtt-node-secret"]
    assert len(secret) == 43 and secret.isalnum()
    agent = yaml.safe_load(default.config_yaml())["collect_agent"]
    assert agent["mqtt_acl"]["node_topics"] == ["/%u/#"]  # pusher.prefix /$(NODE_NAME)
    assert agent["mqtt_acl"]["users"]["kelvin-allocator"] == {"topics": ["#"], "jobs": True}
    (c,) = containers(default.workload("collect-agent")["spec"]["template"]["spec"])
    assert container_env(default, c)["KELVIN_COLLECT_AGENT_MQTT_NODE_SECRET"] == secret
    for component in ("pusher", "allocator"):
        spec = default.workload(component)["spec"]["template"]["spec"]
        (main,) = containers(spec)
        assert secret not in container_env(default, main).values(), component
        assert not any("secret" in v for v in spec["volumes"]), component
        (init,) = [i for i in containers(spec, init=True) if i["name"] == "mqtt-credentials"]
        assert container_env(default, init)["KELVIN_MQTT_NODE_SECRET"] == secret


def test_pusher_prefix_sets_the_node_filter(chart: ChartRenderer) -> None:
    r = chart.render({"pusher": {"prefix": "/dc/$(NODE_NAME)"}}, "prefix")
    assert yaml.safe_load(r.config_yaml())["collect_agent"]["mqtt_acl"]["node_topics"] == [
        "/dc/%u/#"
    ]


def test_tls_certificate_names_the_service(chart: ChartRenderer, tmp_path: Path) -> None:
    r = chart.render(TLS, "tls")
    data = chart_secret(r, "kelvin-mqtt-tls")
    (tmp_path / "tls.crt").write_text(data["tls.crt"])
    openssl = require_binary("openssl", "openssl")
    text = subprocess.run(
        [openssl, "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for name in (SERVICE, f"{SERVICE}.kelvin.svc", f"{SERVICE}.kelvin.svc.cluster.local"):
        assert f"DNS:{name}" in text


def _materialise(rendered: Rendered, tmp_path: Path) -> dict[str, Path]:
    """The mounts the kubelet would make: certificate, key, CA."""
    data = chart_secret(rendered, "kelvin-mqtt-tls")
    out = {}
    for key in ("tls.crt", "tls.key", "ca.crt"):
        out[key] = tmp_path / key
        out[key].write_text(data[key])
    return out


def _init_password(rendered: Rendered, component: str, out: Path) -> None:
    """Run the component's mqtt-credentials init container command, as the kubelet would."""
    spec = rendered.workload(component)["spec"]["template"]["spec"]
    (init,) = [i for i in containers(spec, init=True) if i["name"] == "mqtt-credentials"]
    env = container_env(rendered, init)
    args = [_expand(a, env) for a in init["command"][1:]]
    args[args.index("--out") + 1] = str(out)
    subprocess.run([sys.executable, *args], env=env, check=True, timeout=60)


@pytest.fixture
def loopback_service(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def resolve(host: Any, *args: Any, **kw: Any) -> Any:
        return real("127.0.0.1" if host == SERVICE else host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


async def test_the_charts_own_pusher_and_allocator_publish_over_tls(
    chart: ChartRenderer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loopback_service: None
) -> None:
    r = chart.render(TLS, "tls")
    files = _materialise(r, tmp_path)
    agent_settings = load_settings(r, "collect-agent", tmp_path, monkeypatch)["collect_agent"]
    pusher = load_settings(r, "pusher", tmp_path, monkeypatch)["pusher"]
    alloc = load_settings(r, "allocator", tmp_path, monkeypatch)["allocator"]
    assert agent_settings.mqtt_node_secret and pusher.mqtt_tls and alloc.mqtt_tls
    settings = agent_settings.model_copy(
        update={
            "host": "127.0.0.1", "port": 0, "mqtt_port": 0, "spool_dir": tmp_path / "spool",
            "mqtt_tls_cert": files["tls.crt"], "mqtt_tls_key": files["tls.key"],
        }
    )  # fmt: skip
    config = Config(overrides={"storage": {"sqlite": {"path": str(tmp_path / "k.sqlite")}}})
    agent = CollectAgent(config, settings)
    await agent.start()
    try:
        port = agent.mqtt_port
        assert port is not None
        # The pusher: its init container's password, its TLS settings, its node's prefix.
        _init_password(r, "pusher", tmp_path / "pusher-password")
        assert str(pusher.mqtt_tls_ca).endswith("/ca.crt")
        tls = client_tls(True, files["ca.crt"], "pusher")
        password = read_password(None, tmp_path / "pusher-password", "pusher")
        assert pusher.mqtt_username and pusher.prefix == f"/{pusher.mqtt_username}"
        host = pusher.brokers[0].rpartition(":")[0]
        async with aiomqtt.Client(
            host, port, username=pusher.mqtt_username, password=password, tls_context=tls,
            protocol=aiomqtt.ProtocolVersion.V5,
        ) as client:  # fmt: skip
            await client.publish(f"{pusher.prefix}/power", codec.encode_dcdb([5], [TS0]), qos=1)
            await client.publish("/another-node/power", codec.encode_dcdb([5], [TS0]), qos=1)
        # The allocator: its own publisher with its rendered TLS settings and user.
        _init_password(r, "allocator", tmp_path / "allocator-password")
        publisher = DecisionPublisher(
            [f"{host}:{port}"],
            alloc.sensor_prefix,
            AllocatorMetrics(),
            username=alloc.mqtt_username,
            password=read_password(None, tmp_path / "allocator-password", "allocator"),
            tls=client_tls(alloc.mqtt_tls, files["ca.crt"], "allocator"),
        )
        publisher.offer_job("tls-job", TS0, 0, ["node-a"])
        publisher.start()
        await asyncio.wait_for(publisher._empty.wait(), 30)
        await publisher.stop()
        await agent.spool.wait_empty()
        assert agent.storage is not None
        assert await agent.storage.has_sensor(f"{pusher.prefix}/power")
        assert not await agent.storage.has_sensor("/another-node/power")
        assert [j.job_id for j in await agent.storage.jobs()] == ["tls-job"]
        # Without the CA the agent's certificate is refused.
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client(host, port, tls_context=client_tls(True, None, "x")):
                pass
    finally:
        await agent.stop()
    assert json.dumps(agent.ingestor.rejected) == '{"denied_topic": 1}'
