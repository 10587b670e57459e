"""Spools that outlive their agent: a scale-down whose removed agent's spool another agent
drains (real ``kelvin run collect-agent`` processes, a real InfluxDB outage), the owner
taking its directory back from a claimer, and ``kelvin spool drain`` (the drain Job)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from services.cli import main as kelvin
from services.collect_agent import spool_format as fmt
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.orphans import drain_dir
from services.collect_agent.spool import WANTED, Spool
from services.common.readings import Batch
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from tests.collect_agent.test_drain import TS0, agent, publish, stored
from tests.collect_agent.test_spool import crash
from tests.collect_agent.test_writer import FlakyStorage
from tests.support.influxdb import InfluxDB


async def left_behind(directory: Path, records: int = 5, per: int = 100) -> int:
    """A spool as a killed or scaled-down agent leaves it: ``records`` undrained records."""
    spool = Spool(directory)
    await spool.open()
    for r in range(records):
        ts = TS0 + r * per + np.arange(per)
        b = Batch.single("/orphan/s", ts, np.arange(per, dtype=float))
        await spool.append([(b, fmt.encode_readings(b))])
    crash(spool)
    return records * per


@pytest.mark.slow
async def test_a_scaled_down_agents_spool_is_drained_by_a_remaining_agent(
    tmp_path: Path, influxd: InfluxDB
) -> None:
    db, sensor, peers = "orphans", "/orphan/p", tmp_path / "spools"
    shared = {"spool_peers_dir": str(peers), "orphan_scan_s": 0.2, "drain_timeout_s": 1}
    stay = agent(tmp_path, "a0", influxd, db, spool_dir=str(peers / "a0"), **shared)
    gone = agent(tmp_path, "a1", influxd, db, spool_dir=str(peers / "a1"), **shared)
    stay.start()
    gone.start()
    try:
        influxd.stop()  # storage is down: what a1 acknowledges stays in its spool
        acked = await publish(gone.mqtt_port, sensor, 0, 30)
        assert gone.terminate() == 0  # the scale-down: its drain time passes in the outage
        assert list((peers / "a1").glob("spool-*.wal")), "a1 left its spool behind"
        influxd.start()
        await stay.until(
            "the orphan drained", lambda s: not list((peers / "a1").glob("spool-*.wal"))
        )
        assert await stored(influxd, db, sensor) == [TS0 + k for k in range(acked)]
        assert f"claimed the spool {peers / 'a1'} that no agent holds" in stay.log.read_text()
    finally:
        stay.stop()
        gone.stop()


async def test_an_owner_that_comes_back_takes_its_spool_from_the_claimer(tmp_path: Path) -> None:
    spool_dir = tmp_path / "a1"
    written = await left_behind(spool_dir)
    storage = FlakyStorage(tmp_path / "k.sqlite")
    await storage.open()
    storage.down = True  # the claimer holds the spool, retrying
    claim = asyncio.create_task(drain_dir(spool_dir, storage, AgentMetrics(), retry_max_s=0.05))
    await storage.failed.wait()
    owner = Spool(spool_dir, lock_wait_s=10)
    await owner.open()  # asks for it (the WANTED file), waits, gets it
    assert await claim == (0, written)
    assert owner.pending_readings == written and not (spool_dir / WANTED).exists()
    await owner.close()
    await storage.close()


async def test_kelvin_spool_drain_writes_a_left_behind_spool_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool_dir = tmp_path / "ordinal-3"
    written = await left_behind(spool_dir)
    config = tmp_path / "kelvin.yaml"
    config.write_text(f"storage:\n  sqlite:\n    path: {tmp_path / 'k.sqlite'}\n")
    rc = await asyncio.to_thread(
        kelvin, ["spool", "drain", str(spool_dir), "--config", str(config)]
    )
    assert rc == 0 and f"{written} readings written, 0 left" in capsys.readouterr().out
    storage = SqliteStorage(SqliteSettings(path=tmp_path / "k.sqlite"))
    await storage.open()
    try:
        assert len(await storage.read("/orphan/s", 0, 2**62)) == written
    finally:
        await storage.close()
    assert not list(spool_dir.glob("spool-*.wal"))
