"""The agent as a whole: what it knows before it takes its first publish."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt

from services.collect_agent.app import CollectAgent
from services.collect_agent.settings import Settings
from services.common import codec
from services.common.sensors import SensorMetadata
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from tests.collect_agent.conftest import agent_config
from tests.support.auth import MQTT_LOGIN

TS0 = 1_764_500_000_000_000_000


class SlowToOpen(SqliteStorage):
    """SQLite that answers only a while after the agent asked (a database still starting)."""

    async def open(self) -> None:
        ready = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, ready.set)
        await ready.wait()
        await super().open()


async def test_stored_scales_apply_to_the_first_publishes_after_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "k.sqlite"
    earlier = SqliteStorage(SqliteSettings(path=db))  # what a previous run learned
    await earlier.open()
    await earlier.put_metadata(SensorMetadata(name="/r/power", scale=0.5))
    await earlier.close()
    cfg = agent_config(tmp_path)
    agent = CollectAgent(cfg, cfg.load(Settings), storage=SlowToOpen(SqliteSettings(path=db)))
    await agent.start()
    try:
        assert agent.mqtt_port
        async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
            await client.publish("/r/power", codec.encode_dcdb([10], [TS0]), qos=1)
        await agent.spool.wait_empty()
        assert agent.storage is not None
        assert (await agent.storage.read("/r/power", 0, 2**62)).values.tolist() == [5.0]
    finally:
        await agent.stop()
