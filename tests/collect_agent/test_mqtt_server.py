"""The built-in MQTT endpoint against real clients: aiomqtt, Debian's mosquitto_pub, raw bytes."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path

import aiomqtt
import numpy as np

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import CollectAgent
from services.common import codec
from services.common.readings import Batch
from tests.collect_agent.conftest import AgentFactory
from tests.collect_agent.raw_mqtt import RawClient
from tests.support.auth import MQTT_LOGIN, mosquitto_login
from tests.support.servers import require_binary

TS0 = 1_764_500_000_000_000_000


def rejected(agent: CollectAgent, reason: str) -> float:
    value = agent.metrics.service.registry.get_sample_value(
        "kelvin_collect_agent_rejected_total", {"reason": reason}
    )
    return value or 0.0


async def stored(agent: CollectAgent, sensor: str) -> tuple[list[int], list[float]]:
    await agent.spool.wait_empty()
    assert agent.storage is not None
    s = await agent.storage.read(sensor, 0, 2**62)
    return s.timestamps_ns.tolist(), s.values.tolist()


async def test_aiomqtt_qos_0_1_2_dcdb_kvb1_json_are_stored(agent: CollectAgent) -> None:
    assert agent.mqtt_port
    batch = Batch.from_series(
        [
            Batch.single("/t/node1/power", [TS0, TS0 + 1], [1.5, 2.5]).series(0),
            Batch.single("/t/node1/cpu0/user", [TS0], [0.25]).series(0),
        ]
    )
    topic, payload = codec.encode_batch("/t/node1", batch)
    async with aiomqtt.Client(
        "127.0.0.1", agent.mqtt_port, identifier="pusher-1", **MQTT_LOGIN
    ) as client:
        await client.publish("/t/q0", codec.encode_dcdb([10], [TS0]), qos=0)
        await client.publish("/t/q1", codec.encode_dcdb([11, 12], [TS0, TS0 + 5]), qos=1)
        await client.publish("/t/q2", codec.encode_dcdb([13], [TS0]), qos=2)
        await client.publish(topic, payload, qos=1)
        await client.publish("/t/json", json.dumps([{"ts": TS0, "value": 3.5}]), qos=1)
    assert await stored(agent, "/t/q0") == ([TS0], [10.0])
    assert await stored(agent, "/t/q1") == ([TS0, TS0 + 5], [11.0, 12.0])
    assert await stored(agent, "/t/q2") == ([TS0], [13.0])
    assert await stored(agent, "/t/node1/power") == ([TS0, TS0 + 1], [1.5, 2.5])
    assert await stored(agent, "/t/node1/cpu0/user") == ([TS0], [0.25])
    assert await stored(agent, "/t/json") == ([TS0], [3.5])


async def test_scale_from_metadata_applies_to_dcdb_integers(agent: CollectAgent) -> None:
    assert agent.mqtt_port
    async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
        await client.publish(
            "/DCDB_MAP/METADATA//s/power", json.dumps({"scale": "0.001", "unit": "W"}), qos=1
        )
        await client.publish("/s/power", codec.encode_dcdb([1500, -250], [TS0, TS0 + 1]), qos=1)
        await client.publish("/s/other", codec.encode_dcdb([1500], [TS0]), qos=1)
    assert await stored(agent, "/s/power") == ([TS0, TS0 + 1], [1.5, -0.25])
    assert await stored(agent, "/s/other") == ([TS0], [1500.0])
    assert agent.storage is not None
    meta = await agent.storage.get_metadata("/s/power")
    assert meta is not None and meta.scale == 0.001 and meta.unit == "W"


async def test_a_nan_or_infinite_scale_is_refused_and_counted(agent: CollectAgent) -> None:
    assert agent.mqtt_port
    async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
        await client.publish("/DCDB_MAP/METADATA//n/power", json.dumps({"scale": "0.5"}), qos=1)
        for bad in (
            '{"scale": "NaN"}',
            '{"scale": NaN}',
            '{"scale": "Infinity"}',
            '{"scale": -1e999}',
        ):
            await client.publish("/DCDB_MAP/METADATA//n/power", bad, qos=1)
        await client.publish("/n/power", codec.encode_dcdb([10, 20], [TS0, TS0 + 1]), qos=1)
    # the readings after the refused announcements keep the last good scale
    assert await stored(agent, "/n/power") == ([TS0, TS0 + 1], [5.0, 10.0])
    assert agent.ingestor.rejected.get("non_finite") == 4
    assert agent.storage is not None
    meta = await agent.storage.get_metadata("/n/power")
    assert meta is not None and meta.scale == 0.5


async def test_public_name_and_job_records_are_stored(agent: CollectAgent) -> None:
    assert agent.mqtt_port
    job = {"jobid": "42", "userid": "alice", "starttime": TS0, "endtime": 0, "nodes": ["n1"]}
    async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
        await client.publish("/DCDB_MAP//j/node1/power", b"node1-power", qos=1)
        await client.publish("/DCDB_JOBDATA/", json.dumps(job), qos=1)
    await agent.spool.wait_empty()
    assert agent.storage is not None
    meta = await agent.storage.get_metadata("/j/node1/power")
    assert meta is not None and meta.public_name == "node1-power"
    jobs = await agent.storage.jobs()
    assert [(j.job_id, j.user_id, j.start_ns, j.nodes) for j in jobs] == [
        ("42", "alice", TS0, ("n1",))
    ]


async def test_mosquitto_pub_record_and_8_byte_value(agent: CollectAgent, tmp_path: Path) -> None:
    exe = require_binary("mosquitto_pub", "mosquitto-clients")
    rec = tmp_path / "rec.bin"
    rec.write_bytes(struct.pack("<qQ", -1234567890123, TS0 + 789))
    single = tmp_path / "single.bin"
    single.write_bytes(struct.pack("<q", 77))
    port = str(agent.mqtt_port)
    before = time.time_ns()
    for args in (
        ["-q", "1", "-t", "/m/rec", "-f", str(rec)],
        ["-q", "2", "-t", "/m/one", "-f", str(single)],
    ):
        proc = await asyncio.create_subprocess_exec(
            exe, "-h", "127.0.0.1", "-p", port, *mosquitto_login(), *args
        )
        assert await proc.wait() == 0
    assert await stored(agent, "/m/rec") == ([TS0 + 789], [-1234567890123.0])
    ts, vs = await stored(agent, "/m/one")
    assert vs == [77.0] and before <= ts[0] <= time.time_ns()


async def test_malformed_payload_is_counted_acked_and_connection_kept(agent: CollectAgent) -> None:
    assert agent.mqtt_port
    client, connack = await RawClient.connect(agent.mqtt_port)
    assert connack == (0x20, b"\x00\x00")
    await client.send(mp.publish("/bad/len", b"12345", qos=1, pid=7))
    assert await client.read() == (0x40, b"\x00\x07")  # 3.1.1 has no negative ack
    await client.send(mp.publish("/bad/+/wild", codec.encode_dcdb([1], [TS0]), qos=1, pid=8))
    assert await client.read() == (0x40, b"\x00\x08")
    await client.send(mp.publish("/good/one", codec.encode_dcdb([5], [TS0]), qos=1, pid=9))
    assert await client.read() == (0x40, b"\x00\x09")
    await client.send(bytes((mp.PINGREQ << 4, 0)))
    assert await client.read() == (0xD0, b"")
    await client.close()
    assert rejected(agent, "bad_length") == 1
    assert rejected(agent, "bad_topic") == 1
    assert await stored(agent, "/good/one") == ([TS0], [5.0])


async def test_v5_rejections_carry_reason_codes(agent: CollectAgent) -> None:
    assert agent.mqtt_port
    client, (first, body) = await RawClient.connect(agent.mqtt_port, level=5)
    assert first == 0x20 and body[1] == 0
    await client.send(mp.publish("/v5//empty", codec.encode_dcdb([1], [TS0]), 1, 1, level=5))
    assert await client.read() == (0x40, b"\x00\x01\x90")
    await client.send(mp.publish("/v5/bad", b"{not json}", 1, 2, level=5))
    assert await client.read() == (0x40, b"\x00\x02\x99")
    await client.send(mp.publish("/v5/ok", codec.encode_dcdb([1], [TS0]), 1, 3, level=5))
    assert await client.read() == (0x40, b"\x00\x03")
    await client.close()
    assert rejected(agent, "bad_json") == 1


async def test_many_dcdb_publishes_from_one_read_are_all_acked_and_stored(
    agent: CollectAgent,
) -> None:
    assert agent.mqtt_port
    client, _ = await RawClient.connect(agent.mqtt_port)
    n = 2000
    await client.send(
        b"".join(
            mp.publish(f"/bulk/s{i % 50}", codec.encode_dcdb([i], [TS0 + i]), 1, i + 1)
            for i in range(n)
        )
    )
    pids = [struct.unpack(">H", (await client.read())[1])[0] for _ in range(n)]
    assert pids == list(range(1, n + 1))  # in order, each once
    await client.close()
    ts, vs = await stored(agent, "/bulk/s7")
    assert ts == [TS0 + i for i in range(7, n, 50)]
    assert np.array_equal(vs, [float(i) for i in range(7, n, 50)])


async def test_wrong_first_packet_and_garbage_close_the_connection(
    make_agent: AgentFactory,
) -> None:
    agent = await make_agent()
    assert agent.mqtt_port
    reader, writer = await asyncio.open_connection("127.0.0.1", agent.mqtt_port)
    writer.write(mp.publish("/x/y", codec.encode_dcdb([1], [TS0])))
    client = RawClient(reader, writer)
    assert await client.closed()
    assert rejected(agent, "protocol_error") == 1
    client, _ = await RawClient.connect(agent.mqtt_port)
    await client.send(b"\x30\xff\xff\xff\xff\x01")  # remaining length > 4 bytes
    assert await client.closed()
    assert rejected(agent, "malformed_packet") == 1
