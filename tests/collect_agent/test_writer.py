"""Nothing acknowledged is lost: storage outages, back-pressure at the spool quota, poison records.

Storage is the real SQLite backend wrapped so that writes fail while the test
says it is down (the outage a stopped database causes, without killing one).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiomqtt
import httpx
import numpy as np

from benchmarks.loadgen_mqtt import Login, dcdb_packets, publish
from services.collect_agent import spool_format as fmt
from services.collect_agent.app import CollectAgent
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.spool import Entry, Spool
from services.collect_agent.writer import Writer
from services.common import codec
from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.readings import Batch
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from tests.collect_agent.conftest import AgentFactory, agent_config
from tests.support.auth import MQTT_LOGIN
from tests.support.influxdb import InfluxDB

TS0 = 1_764_500_000_000_000_000


class FlakyStorage(SqliteStorage):
    """SQLite whose writes fail while ``down`` (retryable) or for ``poison`` sensors (permanent)."""

    def __init__(self, path: Path) -> None:
        super().__init__(SqliteSettings(path=path))
        self.down = False
        self.poison: set[str] = set()
        self.failed = asyncio.Event()
        self.writes: list[Batch] = []

    async def write(self, batch: Batch) -> None:
        if self.down:
            self.failed.set()
            raise RetryableStorageError("storage is down (test)")
        bad = self.poison.intersection(batch.sensors)
        if bad:
            raise PermanentStorageError(f"refusing {sorted(bad)} (test)")
        await super().write(batch)
        self.writes.append(batch)


async def start(tmp_path: Path, storage: FlakyStorage, **settings: Any) -> CollectAgent:
    from services.collect_agent.settings import Settings

    cfg = agent_config(tmp_path, writer_retry_max_s=0.1, **settings)
    agent = CollectAgent(cfg, cfg.load(Settings), storage=storage)
    await agent.start()
    return agent


async def test_outage_spools_acks_then_drains_in_order(tmp_path: Path) -> None:
    storage = FlakyStorage(tmp_path / "k.sqlite")
    storage.down = True
    agent = await start(tmp_path, storage)
    try:
        assert agent.mqtt_port
        async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
            for i in range(40):  # each publish returns on its PUBACK
                await client.publish(
                    "/o/s", codec.encode_dcdb([i, i], [TS0 + 2 * i, TS0 + 2 * i + 1]), qos=1
                )
        await storage.failed.wait()
        assert agent.spool.pending_readings == 80
        stats = agent.stats()
        assert stats["spool"]["pending_readings"] == 80 and stats["storage"]["last_error"]
        assert len(await storage.read("/o/s", 0, 2**62)) == 0
        storage.down = False
        await agent.spool.wait_empty()
        stored = await storage.read("/o/s", 0, 2**62)
        assert stored.timestamps_ns.tolist() == [TS0 + k for k in range(80)]
        assert stored.values.tolist() == [float(k // 2) for k in range(80)]
        order = np.concatenate([b.timestamps_ns for b in storage.writes])
        assert bool(np.all(np.diff(order) > 0))  # drained in the order received
    finally:
        await agent.stop()


async def test_spool_quota_applies_back_pressure_and_loses_nothing(tmp_path: Path) -> None:
    storage = FlakyStorage(tmp_path / "k.sqlite")
    storage.down = True
    agent = await start(tmp_path, storage, spool_max_bytes=1 << 20, spool_segment_bytes=1 << 16)
    pressure = asyncio.Event()
    agent.ingestor.on_pressure.append(lambda on: pressure.set() if on else None)
    try:
        assert agent.mqtt_port
        packets = dcdb_packets(1200, 100, 50)  # 1.9 MB of records, twice the quota
        sender = asyncio.create_task(
            asyncio.to_thread(publish, agent.mqtt_port, packets, 2, 400, 1, Login(**MQTT_LOGIN))
        )
        await pressure.wait()
        assert not sender.done()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{agent.port}") as http:
            assert (await http.get("/readyz")).status_code == 503
            assert (await http.get("/api/v1/stats")).json()["backpressure"] is True
        assert agent.spool.over_quota
        storage.down = False
        result = await sender
        assert result["messages"] == 1200
        await agent.spool.wait_empty()
        assert (await storage.stats())["readings"] == 120_000
        assert not agent.ingestor.paused
    finally:
        await agent.stop()


async def test_permanently_refused_series_is_quarantined_others_stored(tmp_path: Path) -> None:
    storage = FlakyStorage(tmp_path / "k.sqlite")
    storage.poison = {"/p/bad"}
    agent = await start(tmp_path, storage)
    try:
        assert agent.mqtt_port
        async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
            await client.publish("/p/good", codec.encode_dcdb([1], [TS0]), qos=1)
            await client.publish("/p/bad", codec.encode_dcdb([2, 3], [TS0, TS0 + 1]), qos=1)
            await client.publish("/p/good", codec.encode_dcdb([4], [TS0 + 1]), qos=1)
        await agent.spool.wait_empty()
        assert (await storage.read("/p/good", 0, 2**62)).values.tolist() == [1.0, 4.0]
        registry = agent.metrics.service.registry
        assert registry.get_sample_value("kelvin_collect_agent_quarantined_readings_total") == 2
        records, _ = fmt.scan((agent.spool.dir / "quarantine.wal").read_bytes())
        data = (agent.spool.dir / "quarantine.wal").read_bytes()
        kept = [fmt.decode(data[at : at + n]) for _, at, n in records]
        assert [(list(b.sensors), b.values.tolist()) for b in kept if isinstance(b, Batch)] == [
            (["/p/bad"], [2.0, 3.0])
        ]
    finally:
        await agent.stop()


def damage(entry: Entry) -> None:
    """Overwrite a spooled record's kind byte on disk: its body no longer decodes."""
    with open(entry.segment, "r+b") as f:
        f.seek(entry.offset)
        f.write(b"X")


async def test_a_spool_record_damaged_on_disk_is_set_aside_at_once_and_the_rest_stored(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path / "spool", memory_bytes=0)  # every record is read back from disk
    await spool.open()
    batches = [Batch.single(f"/d/s{i}", [TS0, TS0 + 1], [i, i + 0.5]) for i in range(3)]
    for b in batches:
        await spool.append([(b, fmt.encode_readings(b))])
    damage(spool.peek(10**9)[1])
    storage = SqliteStorage(SqliteSettings(path=tmp_path / "k.sqlite"))
    await storage.open()
    writer = Writer(spool, storage, AgentMetrics(), retry_max_s=0.01)
    writer.start()
    await spool.wait_empty()
    await writer.stop()
    assert [len(await storage.read(f"/d/s{i}", 0, 2**62)) for i in range(3)] == [2, 0, 2]
    (d,) = spool.damage  # failed its CRC when read back: set aside at once, not retried
    assert (d.readings, d.incomplete) == (2, False)
    _, spans = fmt.scan(d.kept.read_bytes())
    assert len(spans) == 1 and not writer.quarantine_path.exists()
    await storage.close()
    await spool.close()


async def test_storage_unreachable_at_start_spools_until_it_opens(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the database directory should be")
    storage = FlakyStorage(blocker / "k.sqlite")
    agent = await start(tmp_path, storage, scales_wait_s=0)  # no scales to wait for here
    try:
        assert agent.mqtt_port
        async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
            await client.publish("/u/s", codec.encode_dcdb([9], [TS0]), qos=1)
        assert agent.stats()["storage"]["open"] is False
        assert agent.spool.pending_readings == 1
        blocker.unlink()
        await agent.spool.wait_empty()
        assert (await storage.read("/u/s", 0, 2**62)).values.tolist() == [9.0]
    finally:
        await agent.stop()


async def test_stopped_influxd_acks_into_the_spool_and_drains_after_restart(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    server = InfluxDB(tmp_path).start()
    try:
        settings = server.settings("kelvin_agent_test", retries=0, timeout_s=2)
        agent = await make_agent(
            writer_retry_max_s=0.2,
            storage={"backend": "influxdb", "influxdb": settings.model_dump(mode="json")},
        )
        assert agent.mqtt_port
        async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
            for i in range(20):
                await client.publish("/ix/s", codec.encode_dcdb([i], [TS0 + i]), qos=1)
            await agent.spool.wait_empty()
            server.stop()  # a real outage: the database process is gone
            for i in range(20, 40):
                await client.publish("/ix/s", codec.encode_dcdb([i], [TS0 + i]), qos=1)
        assert agent.spool.pending_readings == 20
        server.start()  # same port, same data directory
        await agent.spool.wait_empty()
        assert agent.storage is not None
        s = await agent.storage.read("/ix/s", 0, 2**62)
        assert s.timestamps_ns.tolist() == [TS0 + i for i in range(40)]
        assert s.values.tolist() == [float(i) for i in range(40)]
    finally:
        server.stop()
