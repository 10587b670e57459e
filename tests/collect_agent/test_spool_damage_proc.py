"""The damaged spool, with real processes: a ``kelvin run collect-agent`` acknowledges 50,000
readings while its storage is unavailable, is killed with SIGKILL, 16 bytes in the middle of
its spool segment are flipped, and the restarted agent (storage back) stores every reading
of every intact record exactly once, counts and logs the damaged record and sets its bytes
aside in ``<spool>/damaged/<segment>@<offset>`` (docs/collect-agent.md, "Damaged spool files").
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from services.collect_agent import mqtt_packets as mp
from services.collect_agent import spool_format as fmt
from services.common import codec
from services.common.readings import Batch
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from tests.collect_agent.agent_proc import AgentProcess
from tests.collect_agent.raw_mqtt import RawClient
from tests.collect_agent.test_scaleout import blocked  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow

TS0 = 1_764_600_000_000_000_000
SENSORS = 10
PER_MESSAGE = 100
MESSAGES_PER_CHUNK = 10
CHUNKS = 50
TOTAL = PER_MESSAGE * MESSAGES_PER_CHUNK * CHUNKS  # 50,000


def sensor(k: int) -> str:
    return f"/damage/s{k % SENSORS}"


async def acknowledge_all(port: int) -> None:
    """QoS 1 publishes in pipelined chunks (several group commits, several records); returns
    once every one was acknowledged."""
    client, connack = await RawClient.connect(port, "damage")
    assert connack[1][1] == 0
    try:
        k = 0
        for _ in range(CHUNKS):
            packets = []
            for _ in range(MESSAGES_PER_CHUNK):
                ts = [TS0 + k * PER_MESSAGE + i for i in range(PER_MESSAGE)]
                payload = codec.encode_dcdb(list(range(PER_MESSAGE)), ts)
                packets.append(mp.publish(sensor(k), payload, 1, k % 65535 + 1))
                k += 1
            await client.send(b"".join(packets))
            for _ in packets:
                first, _body = await client.read(wait_s=30)
                assert first == 0x40, "a PUBACK"
    finally:
        await client.close()


def pairs(batch: Batch) -> set[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for i, name in enumerate(batch.sensors):
        lo, hi = int(batch.offsets[i]), int(batch.offsets[i + 1])
        out.update((name, int(t)) for t in batch.timestamps_ns[lo:hi])
    return out


async def stored_rows(path: Path) -> list[tuple[str, int]]:
    storage = SqliteStorage(SqliteSettings(path=path))
    await storage.open()
    try:
        got = await storage.read_many([sensor(s) for s in range(SENSORS)], 0, 2**62)
        return [(n, int(t)) for n, s in got.items() for t in s.timestamps_ns.tolist()]
    finally:
        await storage.close()


def metric(text: str, name: str) -> float:
    m = re.search(rf'^{name}\{{kind="damaged"\}} (\S+)$', text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


async def test_flipped_bytes_cost_only_their_record_counted_logged_and_set_aside(
    tmp_path: Path,
    blocked: Path,  # noqa: F811
) -> None:
    db = tmp_path / "kelvin.sqlite"
    agent = AgentProcess(tmp_path, "d", blocked).start()  # storage unavailable
    try:
        await acknowledge_all(agent.mqtt_port)
        await agent.until("spooled", lambda s: s["spool"]["pending_readings"] == TOTAL)
        agent.kill9()

        (segment,) = sorted(agent.spool_dir.glob("spool-*.wal"))
        data = bytearray(segment.read_bytes())
        records, damage = fmt.scan(bytes(data))
        assert not damage and len(records) >= 5, "several intact records before the damage"
        # The record that holds the segment's middle, flipped in the middle of its body
        # (its readings' columns; its header stays readable, so its readings are counted).
        middle = len(data) // 2
        (hit,) = [r for r in records if r[1] - fmt.HEADER.size <= middle < r[1] + r[2]]
        seq, body_at, length = hit
        mid = body_at + length // 2
        assert length > 1000, f"a group commit of many readings, not {length} bytes"
        intact: set[tuple[str, int]] = set()
        for _s, at, n in records:
            if (_s, at) != (seq, body_at):
                item = fmt.decode(bytes(data[at : at + n]))
                assert isinstance(item, Batch)
                intact |= pairs(item)
        lost = fmt.readings_count(bytes(data[body_at : body_at + length]))
        assert lost > 0 and len(intact) + lost == TOTAL
        data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])
        segment.write_bytes(bytes(data))
        offset, size = body_at - fmt.HEADER.size, fmt.HEADER.size + length

        agent.start(sqlite=db)  # storage available again
        await agent.until("replayed", lambda s: s["spool"]["pending_readings"] == 0)
        async with httpx.AsyncClient() as c:
            text = (await c.get(f"http://127.0.0.1:{agent.http_port}/metrics")).text
    finally:
        agent.stop()

    rows = await stored_rows(db)
    assert len(rows) == len(set(rows)) == len(intact), "every intact reading, each once"
    assert set(rows) == intact
    assert metric(text, "kelvin_collect_agent_spool_damaged_readings_total") == TOTAL - len(rows)
    assert metric(text, "kelvin_collect_agent_spool_damaged_records_total") == 1
    assert metric(text, "kelvin_collect_agent_spool_damaged_bytes_total") == size
    log = agent.log.read_text()
    assert f"{size} damaged bytes at offset {offset} of {segment.name} skipped" in log
    kept = agent.spool_dir / "damaged" / f"{segment.name}@{offset}"
    assert kept.read_bytes() == bytes(data[offset : offset + size]), "set aside as it was"
