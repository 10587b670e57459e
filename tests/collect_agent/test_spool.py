"""The write-ahead spool on a real directory: append, drain, replay, torn tails, quota."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.collect_agent import spool_format as fmt
from services.collect_agent.spool import WANTED, Entry, Spool, SpoolError
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
    first_len = len(fmt.frame(1, fmt.encode_readings(batch(1))))
    (torn,) = spool.damage
    assert (torn.incomplete, torn.offset, torn.size) == (True, first_len, len(data) - 7 - first_len)
    assert (torn.records, torn.readings) == (1, 10)
    assert torn.kept.read_bytes() == data[first_len:-7]
    got = await drain(spool)
    assert len(got) == 1 and same(got[0], batch(1))
    await spool.close()


async def spooled(
    tmp_path: Path, groups: int = 12, per_group: int = 2, segment_bytes: int = 1 << 12
) -> list[Batch]:
    """A crashed agent's spool: ``groups`` commits of ``per_group`` records, nothing drained."""
    crashed = Spool(tmp_path, segment_bytes=segment_bytes)
    await crashed.open()
    written = [batch(i, 3 + i % 5) for i in range(groups * per_group)]
    for g in range(groups):
        await crashed.append(items(written[g * per_group : (g + 1) * per_group]))
    crash(crashed)
    return written


async def test_a_damaged_record_mid_segment_costs_only_itself(tmp_path: Path) -> None:
    written = await spooled(tmp_path / "s", groups=4)  # one segment of 8 records
    (seg,) = segments(tmp_path / "s")
    data = bytearray(seg.read_bytes())
    frames = [len(fmt.frame(1, fmt.encode_readings(b))) for b in written]
    at = sum(frames[:3]) + 40  # 16 bytes inside the fourth record
    data[at : at + 16] = bytes(16)
    seg.write_bytes(bytes(data))
    spool = Spool(tmp_path / "s")
    await spool.open()
    (d,) = spool.damage
    assert (d.segment, d.offset, d.size, d.incomplete) == (
        seg.name,
        sum(frames[:3]),
        frames[3],
        False,
    )
    assert (d.records, d.readings) == (1, len(written[3]))
    assert d.kept.read_bytes() == bytes(data[d.offset : d.offset + d.size])
    got = await drain(spool)
    assert len(got) == 7 and all(
        same(a, b) for a, b in zip(got, written[:3] + written[4:], strict=True)
    )
    await spool.close()
    again = Spool(tmp_path / "s")  # the segment was rewritten: nothing to skip twice
    await again.open()
    assert not again.damage and again.pending_records == 0
    await again.close()


async def test_a_record_whose_bytes_were_duplicated_is_replayed_once(tmp_path: Path) -> None:
    written = await spooled(tmp_path, groups=3, per_group=1)
    (seg,) = segments(tmp_path)
    data = seg.read_bytes()
    first = len(fmt.frame(1, fmt.encode_readings(written[0])))
    seg.write_bytes(data + data[:first])  # the first record again, after the last
    spool = Spool(tmp_path)
    await spool.open()
    assert spool.duplicate_records == 1 and not spool.damage
    got = await drain(spool)
    assert len(got) == 3 and all(same(a, b) for a, b in zip(got, written, strict=True))
    await spool.close()


def flip_last_byte(entry: Entry) -> None:
    with open(entry.segment, "r+b") as f:
        f.seek(entry.offset + entry.length - 1)
        last = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([last[0] ^ 0xFF]))


async def test_a_record_that_fails_its_crc_on_read_back_is_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path, memory_bytes=0)  # every record is read back from disk
    await spool.open()
    await spool.append(items([batch(1), batch(2)]))
    first, second = spool.peek(10**9)
    flip_last_byte(second)  # the kind byte left intact: only the CRC can tell
    assert same(await spool.load(first), batch(1))
    with pytest.raises(fmt.CorruptRecord, match="record 2 fails its checksum"):
        await spool.load(second)
    await spool.set_aside(second)
    (d,) = spool.damage
    assert d.readings == 10 and d.kept.stat().st_size == fmt.HEADER.size + second.length
    await spool.close()


async def test_after_a_failed_fsync_the_next_commit_starts_a_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    await spool.open()
    await spool.append(items([batch(1)]))
    real = os.fdatasync

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(SpoolError, match="Input/output error"):
        await spool.append(items([batch(2)]))  # not acknowledged
    monkeypatch.setattr(os, "fdatasync", real)
    await spool.append(items([batch(3)]))
    assert spool.fsync_errors == 1
    assert len(segments(tmp_path)) == 2, "the segment whose fsync failed got no more writes"
    first_seg = segments(tmp_path)[0]
    assert first_seg.stat().st_size == len(fmt.frame(1, fmt.encode_readings(batch(1))))
    crash(spool)
    replayed = Spool(tmp_path)
    await replayed.open()
    got = await drain(replayed)
    assert len(got) == 2 and same(got[0], batch(1)) and same(got[1], batch(3))
    await replayed.close()


async def test_fuzz_every_intact_record_of_a_damaged_spool_is_replayed_exactly_once(
    tmp_path: Path,
) -> None:
    """Flip, truncate and duplicate bytes at random places of real segments (seeded)."""
    pristine = tmp_path / "pristine"
    written = await spooled(pristine, groups=12, segment_bytes=700)
    frames = {
        path.name: fmt.scan(path.read_bytes())[0] for path in segments(pristine)
    }  # name -> [(seq, body_at, length)]
    assert len(frames) > 2
    rng = random.Random(1764)
    for case in range(120):
        d = tmp_path / f"case{case}"
        d.mkdir()
        intact: set[int] = set()
        for name, recs in frames.items():
            data = bytearray((pristine / name).read_bytes())
            # [start, end, seq, untouched] of every copy of a record in the file
            spans = [[at - fmt.HEADER.size, at + n, seq, True] for seq, at, n in recs]
            for _ in range(rng.randint(0, 2)):
                if not data:
                    break
                op = rng.choice(["flip", "truncate", "duplicate"])
                if op == "flip":
                    p = rng.randrange(len(data))
                    data[p] ^= rng.randint(1, 255)
                    for sp in spans:
                        sp[3] = sp[3] and not sp[0] <= p < sp[1]
                elif op == "truncate":
                    p = rng.randrange(len(data) + 1)
                    del data[p:]
                    for sp in spans:
                        sp[3] = sp[3] and sp[1] <= p
                else:
                    a0 = rng.randrange(len(data))
                    chunk = bytes(data[a0 : a0 + rng.randint(1, 400)])
                    p = rng.randrange(len(data) + 1)
                    data[p:p] = chunk
                    copies = [
                        [sp[0] - a0 + p, sp[1] - a0 + p, sp[2], True]
                        for sp in spans
                        if sp[3] and a0 <= sp[0] and sp[1] <= a0 + len(chunk)
                    ]
                    for sp in spans:
                        sp[3] = sp[3] and not sp[0] < p < sp[1]
                        sp[0] += len(chunk) if sp[0] >= p else 0
                        sp[1] += len(chunk) if sp[1] > p else 0
                    spans += copies
            (d / name).write_bytes(bytes(data))
            intact |= {int(sp[2]) for sp in spans if sp[3]}
        spool = Spool(d)
        await spool.open()
        got = await drain(spool)
        assert len(got) == len(intact), f"case {case}"
        expected = [written[seq - 1] for seq in sorted(intact)]
        assert all(same(a, b) for a, b in zip(got, expected, strict=True)), f"case {case}"
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
    assert not replayed.damage
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
def test_fuzz_scan_accounts_for_every_byte_and_never_returns_a_bad_record(
    sizes: list[int], flips: list[tuple[int, int]], cut: int
) -> None:
    frames = [fmt.frame(i + 1, fmt.encode_readings(batch(i, n))) for i, n in enumerate(sizes)]
    data = bytearray(b"".join(frames))
    for pos, val in flips:
        data[pos % len(data)] = val
    data = data[: cut % (len(data) + 1)]
    records, damage = fmt.scan(bytes(data))
    spans = sorted(
        [(at - fmt.HEADER.size, at + n) for _, at, n in records]
        + [(d.offset, d.offset + d.size) for d in damage]
    )
    # records and damaged spans tile the segment exactly
    assert [a for a, _ in spans] + [len(data)] == [0] + [b for _, b in spans]
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


async def test_wait_empty_wakes_only_after_the_drained_disk_is_freed(tmp_path: Path) -> None:
    """Who waits for "empty" sees the quota freed and back-pressure listeners already told
    (the race behind a writer test that found the ingestor still paused)."""
    spool = Spool(tmp_path, segment_bytes=1 << 16, max_bytes=1 << 18)
    await spool.open()
    while not spool.over_quota:
        await spool.append(items([batch(0, 2000)]))
    told: list[bool] = []
    spool.on_released.append(lambda: told.append(spool.over_quota))

    async def waiter() -> tuple[bool, list[bool]]:
        await spool.wait_empty()
        return spool.over_quota, list(told)

    woken = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the waiter waits before the drain starts
    await drain(spool)
    over, seen = await woken
    assert not over and seen and seen[-1] is False
    await spool.close()


async def test_an_agent_that_waits_in_vain_for_its_spool_leaves_no_request_behind(
    tmp_path: Path,
) -> None:
    holder = Spool(tmp_path)
    await holder.open()
    waiter = Spool(tmp_path, lock_wait_s=0.3)
    with pytest.raises(SpoolError, match="in use by another collect agent"):
        await waiter.open()
    assert not (tmp_path / WANTED).exists(), "a stale request would keep claimers away"
    await holder.close()
