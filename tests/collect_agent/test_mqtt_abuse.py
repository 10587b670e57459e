"""The built-in endpoint stays bounded under abusive clients, and keeps serving the others.

Partial packets share one memory budget; nothing big is buffered before a
CONNECT; a connection stalled half-way through a packet is closed even with
keep-alive 0; the file-descriptor limit is raised and ``max_connections`` kept
below it; out of descriptors, accepting pauses and is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import socket
import time
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import httpx

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import CollectAgent
from services.common import codec
from tests.collect_agent.agent_proc import AgentProcess
from tests.collect_agent.conftest import AgentFactory
from tests.collect_agent.raw_mqtt import RawClient
from tests.support.auth import MQTT_LOGIN, mosquitto_login
from tests.support.servers import require_binary

TS0 = 1_764_500_000_000_000_000
REC = codec.encode_dcdb([1], [TS0])
MIB = 1 << 20


def count(agent: CollectAgent, metric: str, **labels: str) -> float:
    v = agent.metrics.service.registry.get_sample_value(f"kelvin_collect_agent_{metric}", labels)
    return v or 0.0


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def until(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll a condition of the agent's own state (arriving bytes have no event to await)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout_s} s")
        await asyncio.sleep(0.02)


async def send(port: int, *data: bytes) -> socket.socket | None:
    """Open a connection and write ``data`` without buffering it in this process (the
    agent shares it): stop when the agent closed it (None) or stopped reading."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    try:
        for d in data:
            await asyncio.wait_for(loop.sock_sendall(sock, d), 1.0)
    except (ConnectionError, BrokenPipeError):
        sock.close()
        return None
    except TimeoutError:
        pass  # the agent paused this connection (kernel buffers full)
    return sock


async def test_partial_packets_share_one_budget_and_others_are_served(
    make_agent: AgentFactory,
) -> None:
    budget = 8 * MIB
    agent = await make_agent(mqtt_partial_budget_bytes=budget)
    assert agent.mqtt_port and agent.mqtt is not None
    port, mqtt = agent.mqtt_port, agent.mqtt
    big = mp.publish("/flood/x", bytes(4 * MIB - 64), 1, 1)
    part = big[: 2 * MIB]  # one object for every connection: the test holds 2 MiB, not 200
    before = rss_bytes()
    # Before CONNECT nothing big is buffered: a huge first packet closes at once.
    early = await asyncio.gather(*(send(port, part) for _ in range(50)))
    huge_connect = mp.connect("c", username="u", password="p" * 60_000)
    early.append(await send(port, huge_connect))
    await until("early floods closed", lambda: count(agent, "rejected_total", reason="protocol_error") + count(agent, "rejected_total", reason="too_large") >= 51)  # fmt: skip
    # 100 clients after CONNECT, each 2 MiB into a 4 MiB packet: 200 MiB unbounded.
    n = 100
    flood = await asyncio.gather(
        *(send(port, mp.connect(f"flood-{i}", **MQTT_LOGIN), part) for i in range(n))
    )

    def settled() -> bool:
        conns = [c for c in mqtt.conns if c.client_id.startswith("flood-")]
        done = n - len(conns)  # closed by the agent
        for c in conns:
            if "budget" in c.paused_by or c.buffered_bytes >= len(part):
                done += 1
        return done == n

    await until("every flood connection read, parked or closed", settled)
    held = rss_bytes() - before
    assert mqtt.budget.reserved <= budget and mqtt.budget.held <= budget // 4
    assert held < budget * 5 // 4 + 24 * MIB, f"RSS grew by {held / MIB:.0f} MiB"
    assert count(agent, "mqtt_partial_waits_total") > 0
    assert count(agent, "mqtt_disconnects_total", reason="partial_budget") > 0
    # A normal client is served meanwhile, and its reading stored.
    async with aiomqtt.Client("127.0.0.1", port, identifier="normal", **MQTT_LOGIN) as client:
        await client.publish("/flood/normal", REC, qos=1)
    for w in [*early, *flood]:
        if w is not None:
            w.close()
    await agent.spool.wait_empty()
    assert agent.storage is not None and await agent.storage.has_sensor("/flood/normal")
    await until("budget released", lambda: mqtt.budget.reserved + mqtt.budget.held == 0)


async def test_keepalive_0_stalled_inside_a_packet_is_swept(make_agent: AgentFactory) -> None:
    agent = await make_agent(mqtt_stall_timeout_s=0.3)
    assert agent.mqtt_port
    idle, _ = await RawClient.connect(agent.mqtt_port, "idle", keepalive_s=0)
    stalled, _ = await RawClient.connect(agent.mqtt_port, "stalled", keepalive_s=0)
    await stalled.send(mp.publish("/s/x", REC * 100, 1, 1)[:500])
    assert await stalled.closed()
    assert count(agent, "mqtt_disconnects_total", reason="stalled_packet") == 1
    # Keep-alive 0 between packets is allowed to idle: still served.
    await idle.send(bytes((mp.PINGREQ << 4, 0)))
    assert await idle.read() == (0xD0, b"")
    await idle.close()


# --------------------------------------------------------------------------- descriptors


def metric(text: str, name: str, **labels: str) -> float:
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^kelvin_collect_agent_{name}(?:{{{lab}}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def test_descriptor_limit_raised_connections_capped_emfile_logged_once(
    tmp_path: Path,
) -> None:
    exe = require_binary("mosquitto_pub", "mosquitto-clients")
    proc = AgentProcess(tmp_path, "fd", tmp_path / "k.sqlite", connect_timeout_s=30)
    proc.preexec = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, 256))
    proc.start()
    base = f"http://127.0.0.1:{proc.http_port}"
    held: list[asyncio.StreamWriter] = []
    try:
        log = proc.log.read_text()
        assert "from 128 to 256" in log and "max_connections capped at 192" in log
        # 400 connections: the agent holds at most 193, the rest are closed at accept.
        for _ in range(400):
            with contextlib.suppress(OSError):
                held.append((await asyncio.open_connection("127.0.0.1", proc.mqtt_port))[1])
        async with httpx.AsyncClient(timeout=10) as http:
            stats = (await http.get(f"{base}/api/v1/stats")).json()  # answers meanwhile
            assert stats["connections"] <= 193
            text = (await http.get(f"{base}/metrics")).text
            assert metric(text, "mqtt_disconnects_total", reason="too_many_connections") > 0
            # Idle HTTP connections take the descriptors left: accept hits EMFILE.
            for _ in range(80):
                with contextlib.suppress(OSError):
                    held.append((await asyncio.open_connection("127.0.0.1", proc.http_port))[1])
            for _ in range(20):
                with contextlib.suppress(OSError):
                    held.append((await asyncio.open_connection("127.0.0.1", proc.mqtt_port))[1])
            await until("EMFILE seen", lambda: "cannot accept connections" in proc.log.read_text())
            for w in held:
                w.close()
            held.clear()
            # Free again: a real client publishes.
            pub = await asyncio.create_subprocess_exec(
                exe, "-h", "127.0.0.1", "-p", str(proc.mqtt_port), "-q", "1",
                "-t", "/fd/ok", "-m", "[1]", "-i", "after-flood", *mosquitto_login(),
            )  # fmt: skip
            assert await pub.wait() == 0
            text = (await http.get(f"{base}/metrics")).text
        log = proc.log.read_text()
        assert metric(text, "mqtt_accept_errors_total", errno="EMFILE") >= 1
        assert log.count("MQTT: cannot accept connections") == 1
        # the agent's HTTP listener may run out too: one line of its own, no traceback
        assert log.count("cannot accept connections") <= 2 and "Traceback" not in log
        assert log.count("accepting connections again") == 1
    finally:
        for w in held:
            w.close()
        proc.stop()
