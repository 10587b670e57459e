"""Nothing unacknowledged is lost: unsent.bin through a kill -9, brokers that ask to move, TLS.

Real processes and servers: the pusher as ``kelvin run pusher`` (for the kill -9),
mosquitto, and Kelvin's collect agent as the MQTT endpoint (its DISCONNECT reason
codes, its TLS listener, its storage to count what arrived).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import CollectAgent
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from services.pusher import mqtt, spool
from services.pusher.app import PusherService
from tests.pusher.conftest import AGENT_LOGIN, Collector, make_config, running, start_agent
from tests.support.auth import AUTH_SECTION
from tests.support.servers import Mosquitto, free_port, require_binary, wait_port

ROOT = Path(__file__).resolve().parents[2]


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


async def _until(what: str, check: Any, within_s: float = 20.0) -> Any:
    """Poll ``check()`` (a subprocess's state: nothing to await) until it is truthy."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {within_s} s")


def _pusher_process(tmp_path: Path, http: int, broker: int) -> subprocess.Popen[bytes]:
    cfg = tmp_path / "kill9.yaml"
    cfg.write_text(
        json.dumps(
            {
                "pusher": {
                    "host": "127.0.0.1",
                    "port": http,
                    "prefix": "/k9",
                    "brokers": [f"127.0.0.1:{broker}"],
                    "state_dir": str(tmp_path / "state"),
                    "flush_timeout_s": 0,
                    "plugins": {"tester": {"sensors": 3, "interval": 50}},
                },
                "logging": {"level": "WARNING"},
                "auth": AUTH_SECTION,  # no token file generated under cwd (the checkout)
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "run", "pusher", "--config", str(cfg)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_port(http, proc=proc, timeout=30)
    return proc


async def test_unsent_readings_survive_a_kill_9_until_a_broker_acknowledges_them(
    tmp_path: Path,
) -> None:
    broker, http = free_port(), free_port()
    path = tmp_path / "state" / "unsent.bin"
    # 1. No broker: readings buffer; a clean stop keeps them in unsent.bin.
    proc = _pusher_process(tmp_path, http, broker)
    try:
        await _until(
            "30 readings buffered", lambda: _status(http)["publisher"]["buffered_readings"] >= 30
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    kept = spool.read(path)
    kept_readings = sum(m.readings for m in kept)
    assert kept_readings >= 30
    # 2. Still no broker: the next start takes them over, then dies by kill -9.
    proc = _pusher_process(tmp_path, http, broker)
    try:
        await _until(
            "unsent.bin taken over", lambda: _status(http)["publisher"]["unsent_file_messages"]
        )
    finally:
        proc.kill()
        proc.wait(30)
    assert spool.read(path) == kept, "unsent.bin is kept until its readings are acknowledged"
    # 3. A broker at last: every kept reading arrives, then the file goes.
    stopped_ns = time.time_ns()
    mosquitto = Mosquitto(tmp_path, port=broker).start()
    col = await Collector(broker).start()
    try:
        async with running(make_config(tmp_path, {"prefix": "/k9"}, broker_port=broker)):
            await col.wait_for(
                lambda: (
                    sum(1 for v in col.readings.values() for t, _ in v if t < stopped_ns)
                    >= kept_readings
                )
            )
        old = [(s, t) for s, pts in col.readings.items() for t, _ in pts if t < stopped_ns]
        assert len(set(old)) == kept_readings, "every kept reading arrived"
        assert not path.exists(), "acknowledged: the file is gone"
    finally:
        await col.stop()
        mosquitto.stop()


# --------------------------------------------------------------------------- moves


async def _stored(db: Path, names: list[str]) -> dict[str, list[int]]:
    storage = SqliteStorage(SqliteSettings(path=db))
    await storage.open()
    try:
        got = await storage.read_many(names, 0, 2**62)
        return {n: s.timestamps_ns.tolist() for n, s in got.items()}
    finally:
        await storage.close()


async def _reconnected(svc: PusherService, reason: int, before: float) -> None:
    label = f"0x{reason:02X}"
    await _until(
        f"reconnected after {label}",
        lambda: (
            svc.metrics.server_disconnects.labels(label)._value.get() > before
            and svc.publisher.connected
        ),
    )


async def test_a_broker_that_asks_its_clients_to_move_loses_nothing(
    tmp_path: Path, agents: list[CollectAgent]
) -> None:
    a = await start_agent(tmp_path, "a")
    agents.append(a)
    port = a.mqtt_port
    assert port is not None
    cfg = make_config(
        tmp_path,
        {
            "prefix": "/mv",
            "client_id": "pusher-mv",
            "reconnect_jitter_s": 0.05,
            "plugins": {"tester": {"sensors": 4, "interval": 50}},
            **AGENT_LOGIN,
        },
        broker_port=port,
    )
    async with running(cfg) as svc:
        await _until("connected", lambda: svc.publisher.sent_readings >= 20)
        for code in (mqtt.RC_USE_ANOTHER_SERVER, mqtt.RC_SERVER_MOVED):
            before = svc.metrics.server_disconnects.labels(f"0x{code:02X}")._value.get()
            conn = a.mqtt.by_id["pusher-mv"] if a.mqtt else None
            assert conn is not None and conn.level == 5, "the pusher speaks MQTT 5"
            conn.write(mp.disconnect(code))  # what a rebalancing agent sends
            conn.close("rebalance")
            await _reconnected(svc, code, before)
        # A rolling update: the agent drains (DISCONNECT 0x8B), another takes the address.
        before = svc.metrics.server_disconnects.labels("0x8B")._value.get()
        agents.remove(a)
        await a.stop()
        b = await start_agent(tmp_path, "b", mqtt_port=port)
        agents.append(b)
        await _reconnected(svc, mp.RC_SERVER_SHUTTING_DOWN, before)
        sent = svc.publisher.sent_readings
        await _until(
            "more readings after the move", lambda: svc.publisher.sent_readings > sent + 20
        )
    produced = svc.metrics.readings.labels("tester")._value.get()
    skipped = svc.metrics.skipped.labels("tester")._value.get()
    assert svc.publisher.dropped_readings == 0 and svc.publisher.sent_readings == produced
    await b.spool.wait_empty()
    names = [f"/mv/tester/s{i:04d}" for i in range(4)]
    stored = await _stored(tmp_path / "kelvin.sqlite", names)
    for n in names:
        ts = stored[n]
        assert len(ts) == len(set(ts)) == produced // 4, f"{n}: every reading stored once"
        # The only holes in the 50 ms grid are beats the loaded machine made it skip (counted).
        assert (ts[-1] - ts[0]) // 50_000_000 + 1 - len(ts) <= skipped, f"{n}: a gap"


# --------------------------------------------------------------------------- TLS


@pytest.fixture
def agent_cert(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for the name the chart's Service has (and 127.0.0.1), self-signed."""
    openssl = require_binary("openssl", "openssl")
    cert, key = tmp_path / "agent.pem", tmp_path / "agent.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=kelvin-collect-agent",
         "-addext", "subjectAltName=DNS:kelvin-collect-agent",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def test_publishes_to_the_agents_tls_endpoint_and_refuses_a_wrong_name(
    tmp_path: Path, agents: list[CollectAgent], agent_cert: tuple[Path, Path]
) -> None:
    cert, key = agent_cert
    agent = await start_agent(tmp_path, "tls", mqtt_tls_cert=str(cert), mqtt_tls_key=str(key))
    agents.append(agent)
    section = {
        "prefix": "/tls",
        "mqtt_tls": True,
        "mqtt_tls_ca": str(cert),
        "plugins": {"tester": {"sensors": 2, "interval": 50}},
        **AGENT_LOGIN,
    }
    # A name the certificate does not carry, and no CA (the system's do not know it): refused.
    for wrong in ({"mqtt_tls_server_name": "elsewhere"}, {"mqtt_tls_ca": None}):
        cfg = make_config(tmp_path, {**section, **wrong}, broker_port=agent.mqtt_port)
        async with running(cfg) as svc:
            await _until("refused", lambda: svc.publisher.last_error)
            assert "certificate" in str(svc.publisher.last_error).lower(), wrong
            assert not svc.publisher.connected and svc.publisher.sent_readings == 0
    right = make_config(
        tmp_path,
        {**section, "mqtt_tls_server_name": "kelvin-collect-agent"},
        broker_port=agent.mqtt_port,
    )
    async with running(right) as svc:
        await _until("sent over TLS", lambda: svc.publisher.sent_readings >= 10)
        assert svc.publisher.status()["tls"] is True
    await agent.spool.wait_empty()
    assert agent.storage is not None and await agent.storage.has_sensor("/tls/tester/s0001")
