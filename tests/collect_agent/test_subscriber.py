"""External-broker mode against a real mosquitto: shared subscriptions, metadata to all, reconnects."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiomqtt

from services.collect_agent.app import CollectAgent
from services.collect_agent.subscriber import topic_filters
from services.common import codec
from tests.collect_agent.conftest import AgentFactory
from tests.support.servers import Mosquitto

TS0 = 1_764_500_000_000_000_000


def test_topic_filters_share_data_and_jobs_but_not_metadata() -> None:
    assert [f for f, _ in topic_filters("g", ["/"])] == ["$share/g//#", "/DCDB_MAP/#"]
    assert [f for f, _ in topic_filters("g", ["/dc/row0", "/lab/"])] == [
        "$share/g//dc/row0/#",
        "$share/g//KELVIN_BATCH//dc/row0/#",
        "$share/g//lab/#",
        "$share/g//KELVIN_BATCH//lab/#",
        "$share/g//DCDB_JOBDATA/#",
        "/DCDB_MAP/#",
    ]


async def spooled_together(agents: list[CollectAgent], n: int) -> None:
    """Until the agents together committed ``n`` readings to their spools."""
    while (total := sum(a.ingestor.readings_spooled for a in agents)) < n:
        waits = [
            asyncio.ensure_future(a.ingestor.wait_spooled(a.ingestor.readings_spooled + 1))
            for a in agents
        ]
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
    assert total == n


async def subscribed(make_agent: AgentFactory, broker: Mosquitto, name: str) -> CollectAgent:
    agent = await make_agent(
        mqtt_enabled=False,
        spool_dir=str(broker.workdir / f"spool-{name}"),
        broker={"host": "127.0.0.1", "port": broker.port, "client_id": name},
    )
    assert agent.subscriber is not None
    await agent.subscriber.subscribed.wait()
    return agent


async def test_two_agents_split_one_stream_and_both_learn_scales(
    make_agent: AgentFactory, mosquitto_broker: Mosquitto
) -> None:
    a = await subscribed(make_agent, mosquitto_broker, "agent-a")
    b = await subscribed(make_agent, mosquitto_broker, "agent-b")
    async with aiomqtt.Client("127.0.0.1", mosquitto_broker.port) as pub:
        await pub.publish("/DCDB_MAP/METADATA//x/s0", json.dumps({"scale": 0.5}), qos=1)
        for i in range(200):
            await pub.publish(f"/x/s{i % 4}", codec.encode_dcdb([i], [TS0 + i]), qos=1)
    # Both share one SQLite file; each must have taken part of the stream.
    assert a.storage is not None and b.subscriber is not None and a.subscriber is not None
    await spooled_together([a, b], 200)
    await a.spool.wait_empty()
    await b.spool.wait_empty()
    assert a.subscriber.messages > 20 and b.subscriber.messages > 20
    s0 = await a.storage.read("/x/s0", 0, 2**62)
    assert s0.timestamps_ns.tolist() == [TS0 + i for i in range(0, 200, 4)]
    assert s0.values.tolist() == [i * 0.5 for i in range(0, 200, 4)]
    assert a.ingestor.scales["/x/s0"] == b.ingestor.scales["/x/s0"] == 0.5
    total = sum([len(await a.storage.read(f"/x/s{k}", 0, 2**62)) for k in range(4)])
    assert total == 200


async def test_reconnects_and_resubscribes_after_broker_restart(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    broker = Mosquitto(tmp_path).start()
    try:
        agent = await subscribed(make_agent, broker, "agent-r")
        assert agent.subscriber is not None
        broker.stop()
        await agent.subscriber.lost.wait()
        broker = Mosquitto(tmp_path, port=broker.port).start()
        await agent.subscriber.subscribed.wait()
        async with aiomqtt.Client("127.0.0.1", broker.port) as pub:
            await pub.publish("/r/x", codec.encode_dcdb([5], [TS0]), qos=1)
        await agent.ingestor.wait_spooled(1)
        await agent.spool.wait_empty()
        assert agent.storage is not None
        assert (await agent.storage.read("/r/x", 0, 2**62)).values.tolist() == [5.0]
        assert agent.subscriber.info()["connected"] is True
    finally:
        broker.stop()


async def test_a_poison_message_is_rejected_and_the_subscription_goes_on(
    make_agent: AgentFactory, mosquitto_broker: Mosquitto
) -> None:
    agent = await subscribed(make_agent, mosquitto_broker, "agent-p")
    async with aiomqtt.Client("127.0.0.1", mosquitto_broker.port) as pub:
        await pub.publish("/p/x", b'{"value": 1, "ts": 1e400}', qos=1)
        await pub.publish("/DCDB_JOBDATA/", b'{"jobid": 1, "starttime": 5, "endtime": [1]}', qos=1)
        await pub.publish("/p/x", codec.encode_dcdb([7], [TS0]), qos=1)
    await agent.ingestor.wait_spooled(1)
    await agent.spool.wait_empty()
    assert agent.storage is not None and agent.subscriber is not None
    assert (await agent.storage.read("/p/x", 0, 2**62)).values.tolist() == [7.0]
    assert agent.ingestor.rejected == {"bad_timestamp": 1, "bad_job": 1}
    assert agent.subscriber.connected
