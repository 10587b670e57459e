"""Prometheus remote write into the collect agent: protocol, refusals, names, durability.

Requests are built with :mod:`services.common.prompb` and snappy as Prometheus sends
them; the real Prometheus sender is in test_remote_write_prometheus.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import cramjam
import httpx
import numpy as np
import pytest

from services.collect_agent.app import CollectAgent
from services.common import prompb
from services.common.auth import Role
from services.common.promnames import series_labels
from tests.collect_agent.conftest import AgentFactory
from tests.support.auth import headers, write_config_yaml
from tests.support.prometheus import KelvinService
from tests.support.servers import free_port

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
T = 1_700_000_000_000


def body(series: list[tuple[list[tuple[str, str]], list[int], list[float]]]) -> bytes:
    raw = prompb.write_request(
        [
            (lab, np.asarray(ts, dtype=np.int64), np.asarray(vs, dtype=np.float64))
            for lab, ts, vs in series
        ]
    )
    return bytes(cramjam.snappy.compress_raw(raw))


NODE = [("__name__", "node_load1"), ("instance", "h1:9100"), ("job", "node")]
DISK = [
    ("__name__", "node_filesystem_avail_bytes"),
    ("instance", "h1:9100"),
    ("mountpoint", "/boot"),
]


async def post(agent: CollectAgent, data: bytes, **extra: str) -> httpx.Response:
    """POST a remote-write body with the write token (``Authorization=...`` overrides it)."""
    sent = {**HEADERS, **headers(Role.WRITE), **extra}
    sent = {k: v for k, v in sent.items() if v}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{agent.port}") as c:
        return await c.post("/api/v1/write", content=data, headers=sent)


async def read(agent: CollectAgent, sensor: str, start: int = 0) -> Any:
    """The sensor's readings once everything spooled is in storage."""
    await agent.spool.wait_empty()
    assert agent.storage is not None
    return await agent.storage.read(sensor, start, 2**62)


def rejected(agent: CollectAgent, reason: str) -> float:
    return float(agent.metrics.rejected.labels(reason)._value.get())


async def test_samples_are_stored_under_their_labels(agent: CollectAgent) -> None:
    r = await post(agent, body([(NODE, [T, T + 15000], [0.5, 0.75]), (DISK, [T], [1e9])]))
    assert r.status_code == 204, r.text
    assert agent.storage is not None
    got = await read(agent, "/prometheus/node_load1/instance=h1:9100/job=node", 0)
    assert got.timestamps_ns.tolist() == [T * 10**6, (T + 15000) * 10**6]
    assert got.values.tolist() == [0.5, 0.75]
    disk = await read(
        agent, "/prometheus/node_filesystem_avail_bytes/instance=h1:9100/mountpoint=%2Fboot", 0
    )
    assert disk.values.tolist() == [1e9]


async def test_a_kelvin_series_goes_back_to_its_sensor(agent: CollectAgent) -> None:
    sensor = "/hall/row0/rack0/node0/power"
    lab = sorted(series_labels(sensor))
    derived = sorted([*(p for p in lab if p[0] != "__name__"), ("__name__", "ALERTS_FOR_STATE")])
    r = await post(agent, body([(lab, [T], [250.0]), (derived, [T], [1.7e9])]))
    assert r.status_code == 204
    assert agent.storage is not None
    assert (await read(agent, sensor)).values.tolist() == [250.0]
    others = [n for n in await agent.storage.sensors("/prometheus") if "ALERTS_FOR_STATE" in n]
    assert len(others) == 1 and "exported_sensor=" in others[0]


async def test_many_samples_per_series_and_odd_samples(agent: CollectAgent) -> None:
    """Long regular runs (read by numpy) and samples proto3 shortens (value 0, time 0)."""
    ts = list(range(T, T + 100 * 1000, 1000))
    vals = [float(i) for i in range(100)]
    vals[3] = 0.0  # encoded without its value field
    r = await post(agent, body([(NODE, ts, vals), (DISK, [0, 5], [0.0, np.nan])]))
    assert r.status_code == 204
    assert agent.storage is not None
    got = await read(agent, "/prometheus/node_load1/instance=h1:9100/job=node", 0)
    assert got.values.tolist() == vals and got.timestamps_ns.tolist() == [t * 10**6 for t in ts]
    disk = await read(
        agent, "/prometheus/node_filesystem_avail_bytes/instance=h1:9100/mountpoint=%2Fboot", -1
    )
    assert disk.timestamps_ns.tolist() == [0, 5 * 10**6] and np.isnan(disk.values[1])


async def test_a_stale_marker_keeps_its_bits(agent: CollectAgent) -> None:
    stale = np.array([0x7FF0000000000002], dtype=np.uint64).view(np.float64)[0]
    assert (await post(agent, body([(NODE, [T, T + 1], [1.0, stale])]))).status_code == 204
    assert agent.storage is not None
    got = await read(agent, "/prometheus/node_load1/instance=h1:9100/job=node", 0)
    assert got.values.view(np.uint64).tolist()[1] == 0x7FF0000000000002


@pytest.mark.parametrize(
    ("data", "reason", "status"),
    [
        (b"not snappy at all", "bad_snappy", 400),
        (bytes(cramjam.snappy.compress_raw(b"\x0a\xff\xff\x03")), "bad_protobuf", 400),
        (bytes(cramjam.snappy.compress_raw(b"\x0b")), "bad_protobuf", 400),
    ],
    ids=["snappy", "truncated", "wire-type"],
)
async def test_undecodable_bodies_are_400_and_counted(
    agent: CollectAgent, data: bytes, reason: str, status: int
) -> None:
    before = rejected(agent, reason)
    r = await post(agent, data)
    assert r.status_code == status and r.json()["error"]
    assert rejected(agent, reason) == before + 1


async def test_bodies_over_the_limit_are_refused_before_expanding(make_agent: AgentFactory) -> None:
    agent = await make_agent(max_payload_bytes=4096)
    big = prompb.write_request([(NODE, np.full(2000, T, dtype=np.int64), np.ones(2000))])
    r = await post(agent, bytes(cramjam.snappy.compress_raw(big)))  # small compressed, big expanded
    assert r.status_code == 400 and "max_payload_bytes" in r.json()["error"]
    assert rejected(agent, "too_large") == 1
    r = await post(agent, os.urandom(5000))
    assert r.status_code == 413


async def test_bad_series_are_named_the_rest_is_stored(agent: CollectAgent) -> None:
    bad = [("__name__", "bad name"), ("job", "x")]
    deep = [("__name__", "x"), *[(f"l{i}", "v") for i in range(40)]]  # deeper than names allow
    r = await post(agent, body([(bad, [T], [1.0]), (NODE, [T], [2.0]), (deep, [T], [3.0])]))
    assert r.status_code == 400
    assert "not stored" in r.json()["error"]
    assert rejected(agent, "bad_metric_name") == 1 and rejected(agent, "bad_name") == 1
    assert agent.storage is not None
    assert (
        await read(agent, "/prometheus/node_load1/instance=h1:9100/job=node", 0)
    ).values.tolist() == [2.0]


async def test_writes_need_the_write_role(agent: CollectAgent) -> None:
    data = body([(NODE, [T], [1.0])])
    assert (await post(agent, data, Authorization="")).status_code == 401
    assert (await post(agent, data, Authorization="Bearer wrong")).status_code == 401
    assert (await post(agent, data, **headers(Role.READ))).status_code == 403  # Grafana's token
    assert (await post(agent, data, **headers(Role.WRITE))).status_code == 204
    assert (await post(agent, data, **headers(Role.ADMIN))).status_code == 204


async def test_a_204_survives_kill_9(tmp_path: Path) -> None:
    """Acknowledged means spooled: SIGKILL right after the 204, before any storage write
    could have happened, and the restarted agent still stores every sample."""
    port = free_port()
    db = tmp_path / "kelvin.sqlite"
    config = (
        f"collect_agent:\n  host: 127.0.0.1\n  port: {port}\n  mqtt_enabled: false\n"
        f"  spool_dir: {tmp_path / 'spool'}\nstorage:\n  sqlite:\n    path: {db}\n"
    ) + write_config_yaml()
    agent = KelvinService(tmp_path, "collect-agent", config, port).start()
    ts = list(range(T, T + 500 * 10, 10))
    try:
        async with httpx.AsyncClient(base_url=agent.url, timeout=30) as c:
            r = await c.post(
                "/api/v1/write",
                content=body([(NODE, ts, [float(i) for i in range(500)])]),
                headers={**HEADERS, **headers(Role.WRITE)},
            )
            assert r.status_code == 204, r.text
        assert agent.proc is not None
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait()
    finally:
        agent.stop()
    agent = KelvinService(tmp_path, "collect-agent", config, port).start()
    try:
        from services.common.storage import open_storage
        from services.common.storage.settings import StorageSettings

        storage = await open_storage(StorageSettings(sqlite={"path": str(db)}))
        try:
            for _ in range(300):
                got = await storage.read(
                    "/prometheus/node_load1/instance=h1:9100/job=node", 0, 2**62
                )
                if len(got) == 500:
                    break
                await asyncio.sleep(0.05)
            assert len(got) == 500, agent.tail()
        finally:
            await storage.close()
    finally:
        agent.stop()
