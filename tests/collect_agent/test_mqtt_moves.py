"""Letting clients go without losing what they sent: shutdown (0x8B), moves (0x9C), rebalancing.

The rebalancing test runs three agents behind a stand-in for their Kubernetes
Service (a random-choice TCP proxy, ``tests/support/tcp_balancer.py``): 30
aiomqtt pushers all connect to the first agent, two more agents are added, and
the connections spread to the fair share while every acknowledged reading is
stored (read back from all three agents' storage).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import CollectAgent
from services.collect_agent.mqtt_rebalance import Peers, excess
from services.common import codec
from tests.collect_agent.conftest import AgentFactory
from tests.collect_agent.raw_mqtt import RawClient
from tests.support.auth import MQTT_LOGIN
from tests.support.servers import free_port
from tests.support.tcp_balancer import Balancer

TS0 = 1_764_500_000_000_000_000


def count(agent: CollectAgent, metric: str, **labels: str) -> float:
    v = agent.metrics.service.registry.get_sample_value(f"kelvin_collect_agent_{metric}", labels)
    return v or 0.0


def test_fair_share_and_tolerance() -> None:
    assert excess(30, [0, 0], 0.1) == (20, 10)
    assert excess(11, [10, 9], 0.1) == (0, 10)  # within one of the share
    assert excess(12, [9, 9], 0.1) == (2, 10)  # one over the tolerance: back to the share
    assert excess(13, [9, 8], 0.1) == (3, 10)
    assert excess(5, [], 0.1) == (0, 5)  # no peer answered: nothing to compare with


async def test_peers_from_a_dns_name_skip_this_host() -> None:
    peers = Peers(["http://agent-0:8081/"], "localhost", 8081)
    assert await peers.resolve() == ["http://agent-0:8081"]  # localhost is this host
    peers._own = set()  # as seen from another pod: each address of the name is a peer
    assert "http://127.0.0.1:8081" in await peers.resolve()


async def test_refuse_new_acks_what_was_read_then_disconnects(agent: CollectAgent) -> None:
    assert agent.mqtt_port and agent.mqtt is not None
    v5, _ = await RawClient.connect(agent.mqtt_port, "v5", level=5)
    v3, _ = await RawClient.connect(agent.mqtt_port, "v3")
    await v5.send(mp.publish("/bye/v5", codec.encode_dcdb([1], [TS0]), 1, 1, level=5))
    await v3.send(mp.publish("/bye/v3", codec.encode_dcdb([1], [TS0]), 1, 2))
    assert await v5.read() == (0x40, b"\x00\x01")
    assert await v3.read() == (0x40, b"\x00\x02")
    await agent.mqtt.refuse_new()
    assert await v5.read() == (0xE0, bytes((mp.RC_SERVER_SHUTTING_DOWN,)))
    assert await v5.closed() and await v3.closed()
    with pytest.raises(OSError):  # no longer listening
        await RawClient.connect(agent.mqtt_port, "late")
    assert count(agent, "mqtt_disconnects_total", reason="server_shutting_down") == 2
    await agent.mqtt.refuse_new()  # idempotent


async def test_moved_clients_get_0x9c_after_their_acks(agent: CollectAgent) -> None:
    assert agent.mqtt_port and agent.mqtt is not None
    v5, _ = await RawClient.connect(agent.mqtt_port, "m5", level=5)
    v3, _ = await RawClient.connect(agent.mqtt_port, "m3")
    # Sent before the move: what the agent read is acknowledged before the DISCONNECT,
    # the rest (never read) is for the client to send again elsewhere.
    await v5.send(b"".join(mp.publish("/mv/x", codec.encode_dcdb([i], [TS0 + i]), 1, i + 1, level=5) for i in range(50)))  # fmt: skip
    got = [await v5.read()]
    await agent.mqtt.move(agent.mqtt.movable(), "rebalance")
    while got[-1][0] != 0xE0:
        got.append(await v5.read())
    acks = got[:-1]
    assert acks == [(0x40, bytes((0, i + 1))) for i in range(len(acks))]
    assert got[-1] == (0xE0, bytes((mp.RC_USE_ANOTHER_SERVER,)))
    await agent.spool.wait_empty()
    assert agent.storage is not None
    assert len(await agent.storage.read("/mv/x", 0, 2**62)) >= len(acks)
    assert await v5.closed() and await v3.closed()  # 3.1.1: a plain close
    assert count(agent, "mqtt_disconnects_total", reason="rebalance") == 2


async def test_old_connections_are_asked_to_reconnect(make_agent: AgentFactory) -> None:
    agent = await make_agent(mqtt_max_connection_age_s=0.2, mqtt_rebalance_interval_s=0.05)
    assert agent.mqtt_port
    client, _ = await RawClient.connect(agent.mqtt_port, "aging", level=5)
    assert await client.read() == (0xE0, bytes((mp.RC_USE_ANOTHER_SERVER,)))
    assert count(agent, "mqtt_disconnects_total", reason="max_age") == 1


# --------------------------------------------------------------------------- rebalancing


class Pusher:
    """Publishes one QoS 1 reading every 20 ms through the Service; reconnects after a
    move with jitter and resends what was not acknowledged, as Kelvin's pusher does."""

    def __init__(self, i: int, port: int) -> None:
        self.sensor = f"/rb/p{i:02d}"
        self.id, self.port = f"rb-{i}", port
        self.acked: set[int] = set()
        self.moves = 0
        self.rng = random.Random(i)

    async def run(self, stop: asyncio.Event) -> None:
        k, pending = 0, None
        while not stop.is_set():
            # aiomqtt 2.5 waits out its timeout for the PUBACK of a publish in flight when
            # the server disconnects (it does not fail it on the DISCONNECT): keep it short.
            client = aiomqtt.Client(
                "127.0.0.1", self.port, identifier=self.id,
                protocol=aiomqtt.ProtocolVersion.V5, timeout=0.5, **MQTT_LOGIN,
            )  # fmt: skip
            try:
                async with client:
                    while not stop.is_set():
                        if pending is None:
                            pending, k = k, k + 1
                        payload = codec.encode_dcdb([pending], [TS0 + pending])
                        await client.publish(self.sensor, payload, qos=1)
                        self.acked.add(pending)
                        pending = None
                        await asyncio.sleep(0.02)  # the pusher's sampling interval
            except aiomqtt.MqttError:
                self.moves += 1
            await asyncio.sleep(self.rng.uniform(0, 0.05))  # reconnect jitter


async def test_three_agents_share_30_pushers_and_lose_nothing(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    ports = [free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]

    async def replica(i: int) -> CollectAgent:
        return await make_agent(
            storage={"sqlite": {"path": str(tmp_path / f"agent{i}.sqlite")}},
            spool_dir=str(tmp_path / f"spool{i}"),
            port=ports[i],
            mqtt_peers=[u for j, u in enumerate(urls) if j != i],
            mqtt_rebalance_interval_s=0.1,
            mqtt_rebalance_per_s=100,
        )

    agents = [await replica(0)]
    service = await Balancer([agents[0].mqtt_port or 0]).start()
    stop = asyncio.Event()
    pushers = [Pusher(i, service.port) for i in range(30)]
    tasks = [asyncio.create_task(p.run(stop)) for p in pushers]

    def counts() -> list[int]:
        return [len(a.mqtt.conns) if a.mqtt else 0 for a in agents]

    async def until(check: Any) -> None:
        async with asyncio.timeout(60):
            while not check(counts()):
                waits = [asyncio.ensure_future(a.mqtt.changed.wait()) for a in agents if a.mqtt]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for a, w in zip(agents, waits, strict=False):
                    w.cancel()
                    assert a.mqtt is not None
                    a.mqtt.changed.clear()

    try:
        await until(lambda c: c == [30])
        agents += [await replica(1), await replica(2)]  # the StatefulSet scales up
        service.backends += [agents[1].mqtt_port or 0, agents[2].mqtt_port or 0]
        await until(lambda c: sum(c) == 30 and all(8 <= n <= 11 for n in c))
        assert count(agents[0], "mqtt_disconnects_total", reason="rebalance") >= 19
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await service.stop()
    assert all(p.moves >= 0 for p in pushers) and sum(p.moves for p in pushers) >= 19
    stored: dict[str, set[int]] = {p.sensor: set() for p in pushers}
    for a in agents:
        await a.spool.wait_empty()
        assert a.storage is not None
        for sensor in stored:
            with contextlib.suppress(Exception):
                s = await a.storage.read(sensor, 0, 2**62)
                stored[sensor].update(int(t) - TS0 for t in s.timestamps_ns.tolist())
    for p in pushers:
        assert p.acked, p.sensor
        assert p.acked <= stored[p.sensor], f"{p.sensor}: lost {sorted(p.acked - stored[p.sensor])}"
