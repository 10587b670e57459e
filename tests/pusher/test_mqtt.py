"""The pusher's MQTT client against real brokers: refusals by ACL, MQTT 3.1.1, the window.

mosquitto (MQTT 5: PUBACK reason codes, Receive Maximum) and amqtt (a broker that
speaks only 3.1.1 and refuses an MQTT 5 CONNECT).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.collect_agent.app import CollectAgent
from services.pusher import spool
from tests.pusher.conftest import Collector, make_config, running, start_agent
from tests.support.auth import MQTT_LOGIN
from tests.support.servers import free_port, require_binary, wait_port


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[int]:
    """mosquitto that lets anonymous clients publish only under /ok (and metadata)."""
    binary = require_binary("mosquitto", "mosquitto")
    port = free_port()
    (tmp_path / "acl").write_text("topic write /KELVIN_BATCH//ok/#\ntopic write /DCDB_MAP/#\n"
                                  "topic read #\n")  # fmt: skip
    conf = tmp_path / "acl.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\nacl_file {tmp_path}/acl\n"
        "persistence false\nset_tcp_nodelay true\nmax_queued_messages 0\n"
        + ("user root\n" if os.geteuid() == 0 else "")
    )
    log = open(tmp_path / "acl.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([binary, "-c", str(conf), "-v"], stdout=log, stderr=log)
    try:
        wait_port(port, proc=proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


async def _until(what: str, check: Any, within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s} s")
        await asyncio.sleep(0.02)


async def test_a_publish_the_broker_denies_is_dropped_counted_and_not_retried(
    tmp_path: Path, acl_broker: int
) -> None:
    col = await Collector(acl_broker).start()
    cfg = make_config(
        tmp_path,
        {
            "prefix": "/ok",
            "plugins": {
                "tester": {"sensors": 2, "interval": 50},
                "denied": {"plugin": "tester", "sensors": 3, "interval": 50, "prefix": "/no/t"},
            },
        },
        broker_port=acl_broker,
    )
    try:
        async with running(cfg) as svc:
            denied = svc.metrics.dropped.labels("denied")
            await _until("denials counted", lambda: denied._value.get() >= 30)
            # mosquitto 2.0.11 also closes the connection after a denied QoS 1 PUBLISH;
            # the pusher reconnects and the allowed readings keep flowing.
            await col.wait_for(lambda: len(col.readings.get("/ok/tester/s0001", [])) >= 10)
        assert not any(t.startswith("/KELVIN_BATCH//no") for t in col.topics)
        # Each denied reading is accounted for once: dropped and counted on its refusal, or
        # not sent yet at the stop (kept in unsent.bin). One retried after its refusal would
        # be counted again. (The buffer's size at any instant is no measure: it holds what
        # was sampled during the reconnect the broker forces after each refusal.)
        spool_path = svc.publisher.o.spool_path
        assert spool_path is not None
        unsent = spool.read(spool_path) if spool_path.exists() else []
        unsent_denied = sum(m.readings for m in unsent if m.topic.startswith("/KELVIN_BATCH//no"))
        produced = svc.metrics.readings.labels("denied")._value.get()
        assert denied._value.get() + unsent_denied == produced
    finally:
        await col.stop()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # amqtt's own, about its plugins
async def test_a_broker_that_speaks_only_mqtt_3_1_1_is_used_with_3_1_1(tmp_path: Path) -> None:
    from amqtt.broker import Broker

    port = free_port()
    broker = Broker(
        {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
            "sys_interval": 0,
            "auth": {"allow-anonymous": True, "plugins": ["auth_anonymous"]},
            "topic-check": {"enabled": False},
        }
    )
    await broker.start()
    try:
        cfg = make_config(
            tmp_path,
            {"prefix": "/v3", "plugins": {"tester": {"sensors": 2, "interval": 50}}},
            broker_port=port,
        )
        async with running(cfg) as svc:
            await _until("acknowledged over 3.1.1", lambda: svc.publisher.sent_readings >= 10)
            assert svc.publisher._versions == {f"127.0.0.1:{port}": 4}
    finally:
        await broker.shutdown()


async def test_keep_alive_holds_an_idle_connection_open(
    tmp_path: Path, agents: list[CollectAgent]
) -> None:
    """The collect agent drops a client silent for 1.5 keep-alive periods (swept each
    second); the pusher's PINGREQs keep an idle connection open."""
    from services.pusher import mqtt

    agent = await start_agent(tmp_path, "ka")
    agents.append(agent)
    assert agent.mqtt_port is not None
    lost: asyncio.Future[mqtt.MqttError] = asyncio.get_running_loop().create_future()
    options = mqtt.ConnectOptions(
        "127.0.0.1", agent.mqtt_port, "ka-test", keepalive_s=1, **MQTT_LOGIN
    )
    conn = await mqtt.Connection.open(options, lambda pid, rc: None, lost.set_result)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(lost), 3.5)  # 3.5 periods of silence
        assert not lost.done(), f"the broker dropped the idle connection: {lost.result()}"
        acks: list[int] = []
        conn.on_puback = lambda pid, rc: acks.append(pid)
        conn.publish(b"/ka/x", b"\0" * 16, 1, 7)
        await _until("PUBACK after the idle time", lambda: acks == [7])
    finally:
        conn.disconnect()
