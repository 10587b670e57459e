"""The built-in endpoint under bad and hostile input: limits, timeouts, auth, TLS, QoS 2, sessions."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import aiomqtt
import pytest

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import CollectAgent
from services.common import codec
from services.common.errors import ConfigError
from services.common.storage import open_storage
from tests.collect_agent.conftest import AgentFactory
from tests.collect_agent.raw_mqtt import RawClient
from tests.support.auth import MQTT_LOGIN
from tests.support.servers import require_binary

TS0 = 1_764_500_000_000_000_000
REC = codec.encode_dcdb([1], [TS0])


def disconnects(agent: CollectAgent, reason: str) -> float:
    v = agent.metrics.service.registry.get_sample_value(
        "kelvin_collect_agent_mqtt_disconnects_total", {"reason": reason}
    )
    return v or 0.0


async def test_oversized_publish_is_skipped_counted_and_connection_kept(
    make_agent: AgentFactory,
) -> None:
    agent = await make_agent(max_payload_bytes=2048)
    assert agent.mqtt_port
    client, _ = await RawClient.connect(agent.mqtt_port)
    big = mp.publish("/big/x", codec.encode_dcdb(range(300), [TS0 + i for i in range(300)]), 1, 1)
    for i in range(0, len(big), 700):  # arrives in pieces; never buffered whole
        await client.send(big[i : i + 700])
    assert await client.read() == (0x40, b"\x00\x01")
    await client.send(mp.publish("/big/ok", REC, 1, 2))
    assert await client.read() == (0x40, b"\x00\x02")
    await client.close()
    assert agent.ingestor.rejected == {"too_large": 1}
    await agent.spool.wait_empty()
    assert agent.storage is not None
    assert not await agent.storage.has_sensor("/big/x")
    assert await agent.storage.has_sensor("/big/ok")


async def test_silent_and_stalled_clients_are_cut_off_others_served(
    make_agent: AgentFactory,
) -> None:
    agent = await make_agent(connect_timeout_s=0.3)
    assert agent.mqtt_port
    port = agent.mqtt_port
    _, silent = await asyncio.open_connection("127.0.0.1", port)  # never sends CONNECT
    stalled, _ = await RawClient.connect(port, "stalled", keepalive_s=1)
    await stalled.send(mp.publish("/s/x", REC * 50, 1, 1)[:300])  # half a packet, then nothing
    flooder, _ = await RawClient.connect(port, "flooder")  # never reads its acks
    flood = b"".join(mp.publish(f"/f/s{i % 10}", REC, 1, i % 65535 + 1) for i in range(30_000))
    flooder.writer.write(flood)
    async with aiomqtt.Client("127.0.0.1", port, identifier="good", **MQTT_LOGIN) as good:
        await good.publish("/s/good", REC, qos=1)
    assert await stalled.closed()  # keep-alive 1 s, 1.5 s grace
    assert disconnects(agent, "connect_timeout") == 1
    assert disconnects(agent, "keepalive_timeout") == 1
    silent.close()
    await flooder.close()


async def test_username_password_required_when_configured(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    agent = await make_agent(mqtt_users={"pusher": "pw"})
    assert agent.mqtt_port
    for level, missing, bad_code in ((4, 5, 4), (5, 0x87, 0x86)):
        client, connack = await RawClient.connect(agent.mqtt_port, level=level, login=False)
        assert connack[1][1] == missing and await client.closed()
        client, connack = await RawClient.connect(
            agent.mqtt_port, level=level, username="pusher", password="wrong"
        )
        assert connack[1][1] == bad_code and await client.closed()
    client, connack = await RawClient.connect(agent.mqtt_port, username="pusher", password="pw")
    assert connack == (0x20, b"\x00\x00")
    await client.close()
    exe = require_binary("mosquitto_pub", "mosquitto-clients")
    args = ["-h", "127.0.0.1", "-p", str(agent.mqtt_port), "-q", "1", "-t", "/a/x", "-m", "[1]"]
    ok = await asyncio.create_subprocess_exec(exe, *args, "-u", "pusher", "-P", "pw")
    refused = await asyncio.create_subprocess_exec(
        exe, *args, "-u", "pusher", "-P", "no", stderr=asyncio.subprocess.DEVNULL
    )
    assert await ok.wait() == 0 and await refused.wait() != 0
    assert disconnects(agent, "auth_missing") == 2
    assert disconnects(agent, "auth_failed") == 3


@pytest.fixture
def tls_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (made with Debian's openssl)."""
    openssl = require_binary("openssl", "openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def test_tls_endpoint(make_agent: AgentFactory, tls_pair: tuple[Path, Path]) -> None:
    cert, key = tls_pair
    agent = await make_agent(mqtt_tls_cert=str(cert), mqtt_tls_key=str(key))
    assert agent.mqtt_port
    ctx = ssl.create_default_context(cafile=str(cert))
    async with aiomqtt.Client(
        "127.0.0.1", agent.mqtt_port, tls_context=ctx, **MQTT_LOGIN
    ) as client:
        await client.publish("/tls/x", REC, qos=1)
    await agent.spool.wait_empty()
    assert agent.storage is not None and await agent.storage.has_sensor("/tls/x")


async def test_a_failed_start_releases_the_spool(
    make_agent: AgentFactory, tls_pair: tuple[Path, Path]
) -> None:
    cert, _ = tls_pair
    with pytest.raises(ConfigError, match="mqtt_tls_key is not"):
        await make_agent(mqtt_tls_cert=str(cert))
    agent = await make_agent()  # same spool_dir: its lock was released
    assert agent.mqtt_port


async def test_qos2_flow_duplicates_and_subscribe_refused(agent: CollectAgent) -> None:
    assert agent.mqtt_port
    client, _ = await RawClient.connect(agent.mqtt_port)
    await client.send(mp.publish("/q2/x", REC, 2, 5))
    assert await client.read() == (0x50, b"\x00\x05")
    dup = bytearray(mp.publish("/q2/x", codec.encode_dcdb([2], [TS0 + 1]), 2, 5))
    dup[0] |= 0x08  # DUP: the same message again (PUBREC lost): not ingested twice
    await client.send(bytes(dup))
    assert await client.read() == (0x50, b"\x00\x05")
    await client.send(mp.ack(mp.PUBREL, 5))
    assert await client.read() == (0x70, b"\x00\x05")
    body = b"\x00\x09" + b"\x00\x03/q#" + b"\x01"
    await client.send(bytes((0x82, len(body))) + body)
    assert await client.read() == (0x90, b"\x00\x09\x80")
    await client.close()
    await agent.spool.wait_empty()
    assert agent.storage is not None
    s = await agent.storage.read("/q2/x", 0, 2**62)
    assert s.timestamps_ns.tolist() == [TS0]


async def test_session_takeover_protocol_errors_and_connection_limit(
    make_agent: AgentFactory,
) -> None:
    agent = await make_agent(max_connections=3)
    assert agent.mqtt_port
    port = agent.mqtt_port
    first, _ = await RawClient.connect(port, "same")
    second, connack = await RawClient.connect(port, "same")
    assert connack == (0x20, b"\x00\x00") and await first.closed()
    assert disconnects(agent, "session_taken_over") == 1
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x3c\x00\x01x")  # protocol level 6
    bad = RawClient(reader, writer)
    assert await bad.read() == (0x20, b"\x00\x01") and await bad.closed()
    persistent, connack = await RawClient.connect(port, "", clean=False)
    assert connack == (0x20, b"\x00\x02") and await persistent.closed()
    others = [await RawClient.connect(port, f"c{i}") for i in range(2)]
    extra, connack = await RawClient.connect(port, "one-too-many")
    assert connack == (0x20, b"\x00\x03") and await extra.closed()
    for c, _ in [*others, (second, None)]:
        await c.close()


async def test_stop_commits_and_acks_what_was_received(make_agent: AgentFactory) -> None:
    agent = await make_agent()
    assert agent.mqtt_port
    client, _ = await RawClient.connect(agent.mqtt_port, "last-words")
    await client.send(
        b"".join(
            mp.publish("/stop/x", codec.encode_dcdb([i], [TS0 + i]), 1, i + 1) for i in range(100)
        )
    )
    await agent.stop()
    acks = await client.reader.read()  # until the server closed the connection
    # Every PUBACK the client got is for a reading that is stored (the rest it resends).
    assert len(acks) % 4 == 0
    storage = await open_storage(agent.storage_settings)
    try:
        assert len(await storage.read("/stop/x", 0, 2**62)) >= len(acks) // 4
    finally:
        await storage.close()
