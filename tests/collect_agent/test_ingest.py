"""The ingest pipeline without sockets: grouping, scaling, rejects, acks, cache, spool failure."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.ingest import Ingestor
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.spool import Spool, SpoolError
from services.common import codec
from services.common.cache import SensorCache
from services.common.readings import Batch

TS0 = 1_764_500_000_000_000_000


class Sink:
    """Records what the ingestor tells a connection."""

    def __init__(self) -> None:
        self.acks: list[tuple[list[int], list[int], dict[int, int]]] = []
        self.failed = False

    def acked(self, qos1: list[int], qos2: list[int], codes: dict[int, int]) -> None:
        self.acks.append((list(qos1), list(qos2), dict(codes)))

    def not_durable(self) -> None:
        self.failed = True


def pub(topic: str, payload: bytes, pid: int, qos: int = 1) -> tuple[object, ...]:
    return (mp.PUBLISH, qos, topic.encode(), pid, payload)


async def make(tmp_path: Path, cache: SensorCache | None = None) -> tuple[Ingestor, Spool]:
    spool = Spool(tmp_path, fsync="off")
    await spool.open()
    return Ingestor(spool, AgentMetrics(), cache), spool


async def spooled(spool: Spool) -> Batch:
    items = [await spool.load(e) for e in spool.peek(10**9)]
    return Batch.concat([i for i in items if isinstance(i, Batch)])


async def test_group_commit_scales_in_arrival_order_and_acks_once_durable(tmp_path: Path) -> None:
    ing, spool = await make(tmp_path)
    sink = Sink()
    meta = b'{"scale": 0.5}'
    ing.receive_mqtt(
        sink,
        [
            pub("/g/a", codec.encode_dcdb([12], [TS0]), 1),  # before its metadata: scale 1
            pub("/DCDB_MAP/METADATA//g/a", meta, 2),
            pub("/g/a", codec.encode_dcdb([12], [TS0 + 1]), 3),  # after: scale 0.5
            pub("/g/b", b"\x01" * 5, 4),  # bad length
            pub("/g/c", struct.pack("<qQ", 1, 2**63 + 5), 5),  # uint64 beyond int64
            pub("/g/d", codec.encode_dcdb([7], [TS0]), 6, qos=2),
        ],
        "test",
    )
    assert sink.acks == [] and spool.pending_records == 0  # nothing acked before the commit
    ing.start()
    await ing.wait_spooled(3)
    await ing.stop()
    assert sink.acks == [([1, 2, 3, 4, 5], [6], {4: 0x99})]
    b = await spooled(spool)
    got = sorted(
        zip(
            b.sensor_per_reading().tolist(),
            b.timestamps_ns.tolist(),
            b.values.tolist(),
            strict=True,
        )
    )
    names = list(b.sensors)
    assert sorted((names[i], t, v) for i, t, v in got) == [
        ("/g/a", TS0, 12.0), ("/g/a", TS0 + 1, 6.0), ("/g/d", TS0, 7.0),
    ]  # fmt: skip
    assert ing.rejected == {"bad_length": 1, "bad_timestamp": 1}
    await spool.close()


async def test_an_unexpected_decoder_error_is_a_counted_reject(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ing, spool = await make(tmp_path)
    real = codec.decode_publish

    def buggy(topic: str, payload: bytes, received_ns: int) -> codec.Decoded:
        if topic == "/u/bug":
            raise RuntimeError("decoder bug (test)")
        return real(topic, payload, received_ns)

    monkeypatch.setattr(codec, "decode_publish", buggy)
    sink = Sink()
    ing.receive_mqtt(
        sink, [pub("/u/bug", b'{"value": 1}', 1), pub("/u/ok", b'{"value": 2}', 2)], "test"
    )
    ing.start()
    await ing.wait_spooled(1)
    await ing.stop()
    assert sink.acks == [([1, 2], [], {1: 0x99})]
    assert ing.rejected == {"decoder_error": 1}
    assert (await spooled(spool)).values.tolist() == [2.0]
    await spool.close()


async def test_spool_failure_acks_nothing_and_closes(tmp_path: Path) -> None:
    ing, spool = await make(tmp_path)

    async def broken(items: object) -> None:
        raise SpoolError("disk full (test)")

    spool.append = broken  # type: ignore[method-assign]
    sink = Sink()
    ing.receive_mqtt(sink, [pub("/f/a", codec.encode_dcdb([1], [TS0]), 1)], "test")
    fut = ing.receive_batch(Batch.single("/f/b", [TS0], [1.0]), 1, "http")
    await ing.stop()
    assert sink.acks == [] and sink.failed and not ing.spool_ok
    assert isinstance(fut.exception(), SpoolError)
    await spool.close()
