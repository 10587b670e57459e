"""Scale-out: three agent processes, one killed with SIGKILL mid-stream, nothing acked lost.

Built-in mode: publishers spread over the agents fail over to another agent
and resend what was not acknowledged. External mode: the agents share one
subscription on a real mosquitto; the killed agent comes back with the same
client id and gets its unacknowledged messages again. In both, the killed
agent's storage is unreachable before the kill, so everything it acknowledged
exists only in its spool and must come back by replay after the restart. All
agents share one SQLite file (the backend supports several writer processes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

from services.collect_agent import mqtt_packets as mp
from services.common import codec
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from tests.collect_agent.agent_proc import AgentProcess
from tests.collect_agent.raw_mqtt import RawClient
from tests.support.servers import Mosquitto

pytestmark = pytest.mark.slow

TS0 = 1_764_500_000_000_000_000
SENSORS = 10


def message(pub: int, k: int) -> tuple[str, int]:
    """(sensor, timestamp) of publisher ``pub``'s message ``k``: every one a distinct row."""
    return f"/so/p{pub}/s{k % SENSORS}", TS0 + k


class FailoverPublisher:
    """Publishes QoS 1 in chunks; on a lost connection moves to the next agent and resends
    whatever was not acknowledged (with DUP), as a pusher with several brokers does."""

    def __init__(self, pub: int, ports: list[int], count: int, chunk: int = 100) -> None:
        self.pub, self.ports, self.count, self.chunk = pub, ports, count, chunk
        self.acked: set[int] = set()
        self.sent: set[int] = set()
        self.failovers = 0
        self.progress = asyncio.Event()

    def packet(self, k: int) -> bytes:
        sensor, ts = message(self.pub, k)
        data = bytearray(mp.publish(sensor, codec.encode_dcdb([k], [ts]), 1, k % 65535 + 1))
        if k in self.sent:
            data[0] |= 0x08
        return bytes(data)

    async def run(self) -> None:
        at, target, client = 0, 0, None
        while at < self.count:
            todo = [k for k in range(at, min(at + self.chunk, self.count)) if k not in self.acked]
            try:
                if client is None:
                    client, connack = await RawClient.connect(self.ports[target], f"pub{self.pub}")
                    assert connack[1][1] == 0
                await client.send(b"".join(self.packet(k) for k in todo))
                self.sent.update(todo)
                by_pid = {k % 65535 + 1: k for k in todo}
                for _ in todo:
                    first, body = await client.read(wait_s=30)
                    assert first == 0x40
                    self.acked.add(by_pid[int.from_bytes(body[:2], "big")])
                self.progress.set()
            except (OSError, asyncio.IncompleteReadError):
                client, target = None, (target + 1) % len(self.ports)
                self.failovers += 1
                continue
            at += self.chunk
        if client is not None:
            await client.close()


@pytest.fixture
def blocked(tmp_path: Path) -> Iterator[Path]:
    """A database path that cannot be opened (its directory is a file): storage down."""
    f = tmp_path / "blocked"
    f.write_text("storage is down")
    yield f / "kelvin.sqlite"


async def stored_rows(path: Path, pubs: int) -> set[tuple[str, int]]:
    storage = SqliteStorage(SqliteSettings(path=path))
    await storage.open()
    try:
        names = [f"/so/p{p}/s{s}" for p in range(pubs) for s in range(SENSORS)]
        got = await storage.read_many(names, 0, 2**62)
        return {(n, t) for n, s in got.items() for t in s.timestamps_ns.tolist()}
    finally:
        await storage.close()


async def test_builtin_mode_three_agents_one_killed(tmp_path: Path, blocked: Path) -> None:
    db = tmp_path / "kelvin.sqlite"
    agents = [AgentProcess(tmp_path, n, db if n != "b" else blocked) for n in "abc"]
    for a in agents:
        a.start()
    a, b, c = agents
    try:
        ports = [x.mqtt_port for x in agents]
        count = 1500
        # two publishers per agent; each fails over to the next agent in the list
        pubs = [FailoverPublisher(i, ports[i // 2 :] + ports[: i // 2], count) for i in range(6)]
        tasks = [asyncio.create_task(p.run()) for p in pubs]
        while len(pubs[2].acked) < 300 or len(pubs[3].acked) < 300:
            await asyncio.wait({asyncio.ensure_future(pubs[2].progress.wait())}, timeout=30)
            pubs[2].progress.clear()
        spooled = (await b.stats())["spool"]["pending_readings"]
        b.kill9()  # everything b acknowledged is only in its spool now
        await asyncio.gather(*tasks)
        assert pubs[2].failovers >= 1 and pubs[3].failovers >= 1
        assert all(len(p.acked) == count for p in pubs)
        b.start(sqlite=db)  # storage reachable again; same spool directory
        stats = await b.until(
            "replayed spool drained", lambda s: s["spool"]["pending_records"] == 0
        )
        assert stats["spool"]["replayed_readings"] >= spooled >= 600
        for x in (a, c):
            await x.until("drained", lambda s: s["spool"]["pending_records"] == 0)
        want = {message(p, k) for p in range(6) for k in range(count)}
        assert await stored_rows(db, 6) == want
    finally:
        for x in agents:
            x.stop()


async def test_external_mode_shared_subscription_one_killed(
    tmp_path: Path, blocked: Path, mosquitto_broker: Mosquitto
) -> None:
    db = tmp_path / "kelvin.sqlite"
    broker = {"host": "127.0.0.1", "port": mosquitto_broker.port}
    agents = [
        AgentProcess(
            tmp_path,
            n,
            db if n != "b" else blocked,
            mqtt_enabled=False,
            broker={**broker, "client_id": f"agent-{n}"},
        )
        for n in "abc"
    ]
    for x in agents:
        x.start()
    b = agents[1]
    try:
        for x in agents:
            await x.until("subscribed", lambda s: s["broker_connected"])
        count = 3000
        async with aiomqtt.Client("127.0.0.1", mosquitto_broker.port, identifier="pub0") as pub:
            for k in range(count):
                sensor, ts = message(0, k)
                await pub.publish(sensor, codec.encode_dcdb([k], [ts]), qos=1)
                if k == count // 3:
                    await b.until("b took a share", lambda s: s["readings_spooled"] >= 50)
                    b.kill9()
        b.start(sqlite=db)
        want = {message(0, k) for k in range(count)}
        for x in agents:
            await x.until(
                "drained",
                lambda s: s["spool"]["pending_records"] == 0 and s["readings_spooled"] > 0,
            )
        deadline = asyncio.get_running_loop().time() + 60
        while (got := await stored_rows(db, 1)) != want:
            assert asyncio.get_running_loop().time() < deadline, len(want - got)
            await asyncio.sleep(0.2)
        assert (await b.stats())["spool"]["replayed_readings"] >= 50
    finally:
        for x in agents:
            x.stop()
