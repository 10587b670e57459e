"""SIGTERM drains, as real ``kelvin run collect-agent`` processes during a real InfluxDB outage.

On SIGTERM the agent takes no new data (``/write`` 503 with Retry-After, ``/readyz``
503), keeps writing its spool to storage for ``drain_timeout_s`` while retrying the
failing storage, then exits 0. What it could not write stays in its spool directory:

- a persistent spool (a directory kept across restarts, the chart's PVC): the next
  agent on it replays everything: nothing acknowledged is lost;
- an ephemeral spool (a fresh directory after the restart, an emptyDir): exactly what
  could not be drained is lost, the agent says how much, and nothing else; when storage
  comes back within the drain time, nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiomqtt
import httpx
import pytest

from services.common import codec
from services.common.auth import Role
from services.common.storage import StorageSettings, open_storage
from tests.collect_agent.agent_proc import AgentProcess
from tests.support.auth import MQTT_LOGIN, headers
from tests.support.influxdb import InfluxDB

pytestmark = pytest.mark.slow

TS0 = 1_764_500_000_000_000_000
PER_MESSAGE = 10


def agent(workdir: Path, name: str, server: InfluxDB, db: str, **settings: Any) -> AgentProcess:
    influx = server.settings(db, retries=0, timeout_s=1).model_dump(mode="json")
    return AgentProcess(
        workdir,
        name,
        storage={"backend": "influxdb", "influxdb": influx},
        **{"drain_timeout_s": 3, "scales_wait_s": 0, **settings},
    )


async def publish(port: int, sensor: str, first: int, messages: int) -> int:
    """QoS 1 publishes of PER_MESSAGE readings each; every one returns on its PUBACK."""
    async with aiomqtt.Client("127.0.0.1", port, **MQTT_LOGIN) as client:
        for m in range(first, first + messages):
            ts = [TS0 + m * PER_MESSAGE + i for i in range(PER_MESSAGE)]
            await client.publish(sensor, codec.encode_dcdb(list(range(PER_MESSAGE)), ts), qos=1)
    return messages * PER_MESSAGE


async def stored(server: InfluxDB, db: str, sensor: str) -> list[int]:
    storage = await open_storage(
        StorageSettings(backend="influxdb", influxdb=server.settings(db, retries=0))
    )
    try:
        return (await storage.read(sensor, 0, 2**62)).timestamps_ns.tolist()  # type: ignore[no-any-return]
    finally:
        await storage.close()


async def until_draining(proc: AgentProcess) -> None:
    """Poll ``/readyz`` of the process until it says it drains, then prove ``/write`` is
    refused with Retry-After."""
    deadline = time.monotonic() + 20
    url = f"http://127.0.0.1:{proc.http_port}"
    async with httpx.AsyncClient(base_url=url, headers=headers(Role.WRITE)) as http:
        while True:
            r = await http.get("/readyz")
            if r.status_code == 503 and "draining" in r.json()["reason"]:
                break
            assert time.monotonic() < deadline, r.text
            await asyncio.sleep(0.02)
        w = await http.post("/write", content=f"late v=1 {TS0}", headers=headers(Role.WRITE))
        assert w.status_code == 503 and w.headers["retry-after"], w.text
        assert "shutting down" in w.json()["error"]


def log_of(proc: AgentProcess) -> str:
    return proc.log.read_text()


async def test_sigterm_in_an_outage_keeps_the_spool_and_the_next_agent_replays_it(
    tmp_path: Path, influxd: InfluxDB
) -> None:
    db, sensor = "drain_persistent", "/drain/p"
    first = agent(tmp_path, "a", influxd, db).start()
    try:
        before = await publish(first.mqtt_port, sensor, 0, 10)
        await first.until("stored", lambda s: s["readings_written"] == before)
        influxd.stop()  # the outage: every reading acknowledged now exists only in the spool
        during = await publish(first.mqtt_port, sensor, 10, 30)
        await first.until("spooled", lambda s: s["spool"]["pending_readings"] == during)
        first.proc.send_signal(15)  # type: ignore[union-attr]
        await until_draining(first)
        assert first.proc is not None and first.proc.wait(60) == 0
        first.proc = None
    finally:
        first.stop()
    log = log_of(first)
    assert "draining: taking no new data; writing 300 spooled readings" in log
    assert "stopping with 300 readings still spooled" in log and "written after restart" in log
    assert list(first.spool_dir.glob("spool-*.wal")), "the undrained spool stays on its volume"
    influxd.start()
    assert len(await stored(influxd, db, sensor)) == before  # only what was drained before
    second = agent(tmp_path, "a", influxd, db).start()  # the same directory: the pod's PVC
    try:
        await second.until("replayed", lambda s: s["spool"]["pending_readings"] == 0)
        stats = await second.stats()
        assert stats["spool"]["replayed_readings"] == during
    finally:
        assert second.terminate() == 0
    ts = await stored(influxd, db, sensor)
    assert ts == [TS0 + k for k in range(before + during)]  # all of it, each once


async def test_sigterm_with_an_ephemeral_spool_loses_only_what_could_not_be_drained(
    tmp_path: Path, influxd: InfluxDB
) -> None:
    db, sensor = "drain_ephemeral", "/drain/e"
    # 1. storage stays down for the whole drain time: what is spooled is lost with the
    #    emptyDir, exactly the count the agent names, and nothing else.
    one = agent(tmp_path, "e1", influxd, db, spool_ephemeral=True).start()
    try:
        before = await publish(one.mqtt_port, sensor, 0, 5)
        await one.until("stored", lambda s: s["readings_written"] == before)
        influxd.stop()
        lost = await publish(one.mqtt_port, sensor, 5, 20)
        await one.until("spooled", lambda s: s["spool"]["pending_readings"] == lost)
        assert one.terminate() == 0
    finally:
        one.stop()
    assert f"stopping with {lost} readings still spooled" in log_of(one)
    assert "ephemeral (an emptyDir): they are lost when this pod is deleted" in log_of(one)
    # 2. storage comes back during the drain: the agent writes everything before it exits.
    two = agent(tmp_path, "e2", influxd, db, spool_ephemeral=True, drain_timeout_s=30)
    two.start()  # a fresh directory, as the next pod's emptyDir
    try:
        drained = await publish(two.mqtt_port, sensor, 25, 20)
        stats = await two.stats()
        assert stats["spool"]["pending_readings"] == drained
        assert stats["spool"]["replayed_readings"] == 0  # the old spool went with its pod
        two.proc.send_signal(15)  # type: ignore[union-attr]
        await until_draining(two)
        influxd.start()  # storage answers again within the drain time
        assert two.proc is not None and two.proc.wait(60) == 0
        two.proc = None
    finally:
        two.stop()
    assert f"drained: {drained} readings written" in log_of(two)
    ts = await stored(influxd, db, sensor)
    expected = [TS0 + k for k in range(before)] + [
        TS0 + k for k in range(before + lost, before + lost + drained)
    ]
    assert ts == expected  # lost: exactly the `lost` readings the first agent named
