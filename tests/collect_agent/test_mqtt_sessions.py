"""MQTT 5 Session Expiry as the specification defines it, with paho-mqtt; 3.1.1 unchanged."""

from __future__ import annotations

import asyncio
import struct

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import CollectAgent
from services.common import codec
from tests.collect_agent.conftest import AgentFactory
from tests.collect_agent.paho_client import Paho
from tests.collect_agent.raw_mqtt import RawClient
from tests.support.auth import MQTT_LOGIN

TS0 = 1_764_500_000_000_000_000


async def session(port: int, cid: str, clean: bool, expiry: int | None, **kw: bool) -> bool:
    """Connect with paho, disconnect at once; Session Present of the CONNACK."""
    c = Paho(port, cid, clean_session=clean, **MQTT_LOGIN, **kw)
    code, present = await asyncio.to_thread(c.connect, clean, expiry)
    assert code == 0
    await asyncio.to_thread(c.close)
    return present


def ended(agent: CollectAgent, reason: str) -> float:
    v = agent.metrics.service.registry.get_sample_value(
        "kelvin_collect_agent_mqtt_sessions_ended_total", {"reason": reason}
    )
    return v or 0.0


async def test_v5_session_expiry(agent: CollectAgent) -> None:
    port = agent.mqtt_port
    assert port and agent.mqtt is not None
    # Expiry 0 (absent) with Clean Start 0: the session ends with the connection.
    assert not await session(port, "e0", False, None)
    assert not await session(port, "e0", False, None)
    # Clean Start 1 with expiry 300: kept after the disconnect, resumed by Clean Start 0.
    assert not await session(port, "e300", True, 300)
    assert await session(port, "e300", False, 300)
    assert not await session(port, "e300", True, 300)  # Clean Start 1 discards it
    # The interval runs from the disconnect (a fake clock: no waiting).
    now = [1000.0]
    agent.mqtt.sessions.clock = lambda: now[0]
    assert not await session(port, "e5", True, 5)
    now[0] += 4.9
    assert await session(port, "e5", False, 5)
    now[0] += 5.1
    assert not await session(port, "e5", False, 5)
    # DISCONNECT may shorten it to 0: gone at once.
    c = Paho(port, "short", **MQTT_LOGIN)
    await asyncio.to_thread(c.connect, True, 300)
    await asyncio.to_thread(c.close, 0)
    assert not await session(port, "short", False, 300)


async def test_v311_clean_session_unchanged(agent: CollectAgent) -> None:
    port = agent.mqtt_port
    assert port
    assert not await session(port, "p", False, None, v311=True)
    assert await session(port, "p", False, None, v311=True)
    assert not await session(port, "p", True, None, v311=True)
    assert not await session(port, "p", False, None, v311=True)  # clean 1 ended it


async def test_a_resumed_session_keeps_qos2_exactly_once(agent: CollectAgent) -> None:
    port = agent.mqtt_port
    assert port
    props = {0x11: 300}
    rec = codec.encode_dcdb([1], [TS0])
    first, _ = await RawClient.connect(port, "q2", level=5, clean=True, properties=props)
    await first.send(mp.publish("/sess/q2", rec, 2, 5, level=5))
    assert await first.read() == (0x50, b"\x00\x05")
    await first.close()  # PUBREC lost: no PUBREL sent
    again, (_, body) = await RawClient.connect(port, "q2", level=5, clean=False, properties=props)
    assert body[0] == 1  # Session Present
    dup = bytearray(mp.publish("/sess/q2", codec.encode_dcdb([2], [TS0 + 1]), 2, 5, level=5))
    dup[0] |= 0x08
    await again.send(bytes(dup))
    assert await again.read() == (0x50, b"\x00\x05")  # a duplicate: not stored again
    await again.send(mp.ack(mp.PUBREL, 5))
    assert await again.read() == (0x70, b"\x00\x05")
    await again.close()
    await agent.spool.wait_empty()
    assert agent.storage is not None
    assert (await agent.storage.read("/sess/q2", 0, 2**62)).timestamps_ns.tolist() == [TS0]


async def test_expiry_rules_enforced_and_sessions_bounded(make_agent: AgentFactory) -> None:
    agent = await make_agent(mqtt_max_sessions=3, mqtt_session_expiry_max_s=3600)
    port = agent.mqtt_port
    assert port and agent.mqtt is not None
    # "never expires" is capped, and the CONNACK says so.
    c, (_, body) = await RawClient.connect(port, "cap", level=5, properties={0x11: 0xFFFFFFFF})
    props, _ = mp.parse_properties(body, 2, len(body))
    assert props[0x11] == 3600
    await c.close()
    # A DISCONNECT may not set an expiry when the CONNECT asked for none.
    c, _ = await RawClient.connect(port, "rule", level=5)
    await c.send(bytes((mp.DISCONNECT << 4, 7, 0, 5, 0x11)) + struct.pack(">I", 60))
    assert await c.read() == (0xE0, bytes((mp.RC_PROTOCOL_ERROR,)))
    # Five kept sessions, room for three: the two that expire first go.
    for i in range(5):
        assert not await session(port, f"s{i}", True, 600 + i)
    assert len(agent.mqtt.sessions.sessions) == 3
    assert ended(agent, "limit") == 3  # "cap" and the two oldest of five
    assert await session(port, "s4", False, 600)
    assert not await session(port, "s0", False, 600)
