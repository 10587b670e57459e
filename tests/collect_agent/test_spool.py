"""The write-ahead spool on a real directory: append, drain, replay, torn tails, quota."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.collect_agent import spool_format as fmt
from services.collect_agent.spool import Spool, SpoolError
from services.common.readings import Batch
from services.common.sensors import JobRecord, SensorMetadata

TS0 = 1_764_500_000_000_000_000


def batch(i: int, n: int = 10) -> Batch:
    return Batch.single(f"/sp/s{i}", TS0 + np.arange(n) * 1000, np.arange(n) + i * 0.5)


def items(bs: list[Batch]) -> list[tuple[Batch, bytes]]:
    return [(b, fmt.encode_readings(b)) for b in bs]


async def drain(spool: Spool) -> list[object]:
    out = []
    while spool.pending_records:
        entries = spool.peek(1_000_000)
        out += [await spool.load(e) for e in entries]
        await spool.release(len(entries))
    return out


def crash(spool: Spool) -> None:
    """What a killed agent leaves: files as they are, its directory lock released by the kernel."""
    assert spool._lock_fd is not None
    os.close(spool._lock_fd)
    spool._lock_fd = None
    if spool._fsync_task is not None:
        spool._fsync_task.cancel()


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("spool-*.wal"))


def same(a: object, b: object) -> bool:
    if isinstance(a, Batch) and isinstance(b, Batch):
        return (
            list(a.sensors) == list(b.sensors)
            and np.array_equal(a.offsets, b.offsets)
            and np.array_equal(a.timestamps_ns, b.timestamps_ns)
            and np.array_equal(a.values, b.values)
        )
    return a == b


def test_record_format_round_trips_readings_metadata_and_jobs() -> None:
    b = Batch.concat([batch(1), batch(2, 3), Batch.single("/sp/ü/x", [TS0], [float("nan")])])
    back = fmt.decode(fmt.encode_readings(b))
    assert isinstance(back, Batch) and list(back.sensors) == list(b.sensors)
    assert np.array_equal(back.values, b.values, equal_nan=True)
    meta = SensorMetadata(name="/sp/m", scale=0.5, unit="W")
    back_meta = fmt.decode(fmt.encode_metadata(meta))
    assert back_meta == meta and back_meta.model_fields_set == meta.model_fields_set
    job = JobRecord(job_id="7", start_ns=TS0, nodes=("n1", "n2"))
    assert fmt.decode(fmt.encode_job(job)) == job
    assert fmt.readings_count(fmt.encode_readings(b)) == len(b)


async def test_drained_in_order_and_segments_deleted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1 << 16)
    await spool.open()
    written = [batch(i, 200) for i in range(60)]  # ~200 KiB: several segments
    for i in range(0, 60, 6):
        await spool.append(items(written[i : i + 6]))
    assert len(segments(tmp_path)) > 1
    assert spool.pending_readings == 60 * 200
    got = await drain(spool)
    assert all(same(a, b) for a, b in zip(got, written, strict=True))
    assert spool.pending_readings == 0 and spool.disk_bytes == 0
    assert not segments(tmp_path)
    await spool.close()


async def test_replay_after_crash_returns_undrained_records_once(tmp_path: Path) -> None:
    crashed = Spool(tmp_path)
    await crashed.open()
    written = [batch(i) for i in range(5)]
    meta = SensorMetadata(name="/sp/s1", scale=2.0)
    await crashed.append([*items(written[:2]), (meta, fmt.encode_metadata(meta))])
    await crashed.append(items(written[2:]))
    await crashed.release(2)  # the writer stored the first two batches, then the process died
    crash(crashed)
    spool = Spool(tmp_path)
    await spool.open()
    assert spool.replayed_records == 4 and spool.replayed_readings == 30
    got = await drain(spool)
    assert same(got[0], meta)
    assert all(same(a, b) for a, b in zip(got[1:], written[2:], strict=True))
    await spool.close()
    again = Spool(tmp_path)
    await again.open()
    assert again.pending_records == 0 and again.replayed_records == 0
    await again.close()


async def test_torn_last_record_is_cut_and_kept_aside(tmp_path: Path) -> None:
    crashed = Spool(tmp_path)
    await crashed.open()
    await crashed.append(items([batch(1)]))
    await crashed.append(items([batch(2)]))
    seg = segments(tmp_path)[0]
    data = seg.read_bytes()
    seg.write_bytes(data[:-7])  # the second record's write was torn by the crash
    crash(crashed)
    spool = Spool(tmp_path)
    await spool.open()
    assert spool.corrupt_records == 1
    got = await drain(spool)
    assert len(got) == 1 and same(got[0], batch(1))
    first_len = len(fmt.frame(1, fmt.encode_readings(batch(1))))
    assert (tmp_path / (seg.name + ".torn")).read_bytes() == data[first_len:-7]
    await spool.close()


async def test_records_beyond_the_memory_budget_are_read_back_from_disk(tmp_path: Path) -> None:
    spool = Spool(tmp_path, memory_bytes=1 << 20)
    await spool.open()
    written = [batch(i, 20_000) for i in range(6)]  # 320 KB each: only 3 fit in memory
    for b in written:
        await spool.append(items([b]))
    entries = spool.peek(10**9)
    assert [e.item is None for e in entries] == [False] * 3 + [True] * 3
    got = await drain(spool)
    assert all(same(a, b) for a, b in zip(got, written, strict=True))
    await spool.close()


async def test_a_write_that_fails_halfway_leaves_no_bytes_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path, memory_bytes=0)  # every record is read back from disk
    await spool.open()
    await spool.append(items([batch(1)]))
    real_write = os.write
    calls = 0

    def disk_full(fd: int, data: bytes) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(SpoolError, match="No space left"):
        await spool.append(items([batch(2)]))
    monkeypatch.setattr(os, "write", real_write)
    await spool.append(items([batch(3)]))  # acknowledged: must survive
    got = [await spool.load(e) for e in spool.peek(10**9)]
    assert len(got) == 2 and same(got[0], batch(1)) and same(got[1], batch(3))
    crash(spool)
    replayed = Spool(tmp_path)
    await replayed.open()
    assert replayed.corrupt_records == 0
    got = await drain(replayed)
    assert len(got) == 2 and same(got[0], batch(1)) and same(got[1], batch(3))
    await replayed.close()


async def test_a_new_segment_that_cannot_be_created_is_retried_on_the_next_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path, segment_bytes=1 << 16)
    await spool.open()
    await spool.append(items([batch(1, 5000)]))  # 120 kB: the next commit starts a segment
    real_open = os.open

    def no_more_files(path: object, *args: object, **kwargs: object) -> int:
        if str(path).endswith(".wal"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_more_files)
    with pytest.raises(SpoolError, match="Too many open files"):
        await spool.append(items([batch(2)]))
    monkeypatch.setattr(os, "open", real_open)
    await spool.append(items([batch(3)]))
    crash(spool)
    replayed = Spool(tmp_path)
    await replayed.open()
    got = await drain(replayed)
    assert len(got) == 2 and same(got[0], batch(1, 5000)) and same(got[1], batch(3))
    await replayed.close()


@pytest.mark.parametrize("policy", ["interval", "off"])
async def test_relaxed_fsync_policies_still_persist_for_replay(tmp_path: Path, policy: str) -> None:
    crashed = Spool(tmp_path, fsync=policy, fsync_interval_ms=10)  # type: ignore[arg-type]
    await crashed.open()
    await crashed.append(items([batch(3)]))
    crash(crashed)
    spool = Spool(tmp_path)
    await spool.open()
    got = await drain(spool)
    assert len(got) == 1 and same(got[0], batch(3))
    await spool.close()


async def test_over_quota_is_reported_and_cleared_by_draining(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1 << 16, max_bytes=1 << 18)
    await spool.open()
    while not spool.over_quota:
        await spool.append(items([batch(0, 2000)]))
    assert spool.disk_bytes >= 1 << 18
    await drain(spool)
    assert not spool.over_quota
    await spool.close()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=5),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 10**6),
)
def test_fuzz_scan_stops_at_damage_and_never_returns_a_bad_record(
    sizes: list[int], flips: list[tuple[int, int]], cut: int
) -> None:
    frames = [fmt.frame(i + 1, fmt.encode_readings(batch(i, n))) for i, n in enumerate(sizes)]
    data = bytearray(b"".join(frames))
    for pos, val in flips:
        data[pos % len(data)] = val
    data = data[: cut % (len(data) + 1)]
    records, end = fmt.scan(bytes(data))
    assert end <= len(data)
    for seq, at, length in records:
        body = bytes(data[at : at + length])
        # crc32 passed: the record is intact, so it decodes to what was written
        assert fmt.decode(body).sensors == batch(seq - 1, sizes[seq - 1]).sensors  # type: ignore[union-attr]


async def test_a_second_agent_on_the_same_spool_is_refused(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    await first.open()
    second = Spool(tmp_path)
    with pytest.raises(
        SpoolError, match=f"in use by another collect agent \\(pid {os.getpid()}\\)"
    ):
        await second.open()
    await first.close()
    await second.open()  # free again once the first has closed
    await second.close()
