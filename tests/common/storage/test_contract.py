"""The storage contract (services/common/storage/base.py), run against every backend."""

from __future__ import annotations

import asyncio
import itertools
import math
import time

import numpy as np
import pytest

from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.readings import Batch, Series
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage import Child, StorageBackend
from tests.common.storage.conftest import Store
from tests.common.storage.faults import inject_write_failure

T0 = 1_700_000_000 * 10**9
S = 10**9


def at(*seconds: float) -> np.ndarray:
    return T0 + (np.array(seconds, dtype=np.float64) * S).astype(np.int64)


def assert_series(s: Series, ts: np.ndarray, vs: np.ndarray) -> None:
    assert s.timestamps_ns.dtype == np.int64 and s.values.dtype == np.float64
    assert s.timestamps_ns.tolist() == list(ts)
    np.testing.assert_array_equal(s.values, vs)


async def test_reads_sorted_and_half_open(backend: StorageBackend) -> None:
    ts = at(5, 1, 3, 2, 4, 0)
    await backend.write(Batch.single("/a/b", ts, ts / S))
    s = await backend.read("/a/b", T0 + S, T0 + 4 * S)
    assert_series(s, at(1, 2, 3), at(1, 2, 3) / S)
    assert len(await backend.read("/a/b", T0, T0 + 6 * S)) == 6
    assert len(await backend.read("/a/b", T0 + 5 * S, T0 + 5 * S)) == 0
    assert_series(await backend.read("/a/b", T0 + 5 * S, T0 + 5 * S + 1), at(5), at(5) / S)
    assert len(await backend.read("/a/b", T0 + 5 * S + 1, T0 + 9 * S)) == 0
    assert len(await backend.read("/a/b", T0 - 9 * S, T0)) == 0
    assert len(await backend.read("/a/b", T0 + 4 * S, T0 + S)) == 0  # empty when start > end


async def test_last_write_wins_within_and_across_writes(backend: StorageBackend) -> None:
    await backend.write(Batch.single("/d/x", at(1, 2, 2, 3), [1, 2, 20, 3]))
    assert_series(await backend.read("/d/x", T0, T0 + 9 * S), at(1, 2, 3), np.array([1, 20, 3]))
    await backend.write(Batch.single("/d/x", at(2, 1), [200, 100]))
    assert_series(await backend.read("/d/x", T0, T0 + 9 * S), at(1, 2, 3), np.array([100, 200, 3]))
    # Overlapping windows over many writes (SQLite: across compactions and chunk levels).
    model: dict[int, float] = {}
    for k in range(12):
        secs = np.arange(k * 7, k * 7 + 40)
        vals = np.full(secs.shape, float(k))
        await backend.write(Batch.single("/d/y", at(*secs), vals))
        model.update(zip(at(*secs).tolist(), vals.tolist(), strict=True))
    want = sorted(model.items())
    s = await backend.read("/d/y", T0, T0 + 1000 * S)
    assert s.timestamps_ns.tolist() == [t for t, _ in want]
    assert s.values.tolist() == [v for _, v in want]


async def test_batch_of_100k_readings(backend: StorageBackend) -> None:
    names = [f"/big/r{i // 50}/n{i % 50}" for i in range(1000)]
    per = 100
    ts = np.tile(at(*range(per)), len(names))
    vs = np.arange(len(names) * per, dtype=np.float64)
    offsets = np.arange(0, len(names) * per + 1, per, dtype=np.int64)
    await backend.write(Batch(names, offsets, ts, vs))
    assert len(await backend.sensors("/big")) == 1000
    got = await backend.read_many(names[::97], T0, T0 + per * S)
    for name, s in got.items():
        i = names.index(name)
        assert_series(s, at(*range(per)), vs[i * per : (i + 1) * per])


async def test_cut_points_split_a_range_into_reads_of_the_same_readings(
    backend: StorageBackend,
) -> None:
    """Whatever blocks a backend names, they lie inside the range in order, and reading
    the slices between them gives exactly the one read of the range."""
    ts = at(*range(0, 3000, 3))
    await backend.write(Batch.single("/cut/s", ts, ts.astype(np.float64)))
    if hasattr(backend, "compact"):
        await backend.compact()
    start, end = T0 + S, T0 + 2500 * S
    cuts = await backend.cut_points("/cut/s", start, end)
    assert all(start < c < end for c in cuts) and cuts == sorted(set(cuts))
    assert await backend.cut_points("/cut/unknown", start, end) == []
    bounds = [start, *cuts, end]
    parts = [await backend.read("/cut/s", a, b) for a, b in itertools.pairwise(bounds)]
    whole = await backend.read("/cut/s", start, end)
    assert np.concatenate([p.timestamps_ns for p in parts]).tolist() == whole.timestamps_ns.tolist()
    assert len(whole) == 833


NAMES = [
    "/dc/ümlaut/日本語/温度",
    "/dc/with space/a,b=c",
    "/dc/quote'/dq\"/x",
    "/dc/back\\slash/y\\",
    "/dc/per%cent/%2F",
    "/dc/new\nline/w",
    "/dc/tab\there/🔥",
    "/dc/regex.*?[(|)]^$/{1}",
    "/" + "/".join(f"level{i}" for i in range(32)),
]


async def test_unicode_and_deep_names_round_trip(backend: StorageBackend) -> None:
    n = len(NAMES)
    await backend.write(Batch.from_rows(NAMES, at(*range(n)), np.arange(n, dtype=np.float64)))
    for i, name in enumerate(NAMES):
        assert_series(await backend.read(name, T0, T0 + n * S), at(i), np.array([i]))
        assert await backend.has_sensor(name)
    assert set(await backend.sensors("/dc")) == {x for x in NAMES if x.startswith("/dc/")}
    assert await backend.sensors("/dc/back\\slash") == ["/dc/back\\slash/y\\"]
    assert await backend.sensors("/dc/regex.*?[(|)]^$") == [NAMES[7]]
    kids = await backend.children("/dc")
    assert [k.name for k in kids] == sorted("/".join(x.split("/")[:3]) for x in NAMES[:-1])


async def test_nan_and_infinities_round_trip(backend: StorageBackend) -> None:
    vals = [math.nan, math.inf, -math.inf, 0.0, -2.5, 5e-324, 1.7976931348623155e308, 1e-300]
    await backend.write(Batch.single("/f/x", at(*range(len(vals))), vals))
    got = (await backend.read("/f/x", T0, T0 + 99 * S)).values
    assert math.isnan(got[0])
    assert got[1:].tolist() == vals[1:]


async def test_ttl_retention_truncation_and_delete(backend: StorageBackend) -> None:
    now = time.time_ns()
    secs = np.arange(-60, 1)
    ts = now + secs * S
    for name in ("/t/keep", "/t/short", "/u/x"):
        await backend.write(Batch.single(name, ts, secs.astype(np.float64)))
    await backend.put_metadata(SensorMetadata(name="/t/short", ttl_ms=10_000))
    removed = await backend.apply_retention(now)
    assert removed in (-1, 50)
    assert (await backend.read("/t/short", 0, now + S)).timestamps_ns.tolist() == ts[50:].tolist()
    assert len(await backend.read("/t/keep", 0, now + S)) == 61

    removed = await backend.truncate_before(now - 30 * S, prefix="/t")
    assert removed in (-1, 30)
    assert (await backend.read("/t/keep", 0, now + S)).timestamps_ns.tolist() == ts[30:].tolist()
    assert len(await backend.read("/u/x", 0, now + S)) == 61  # other prefix untouched

    removed = await backend.delete_range("/u/x", now - 10 * S, now - 5 * S)
    assert removed in (-1, 5)
    left = (await backend.read("/u/x", 0, now + S)).timestamps_ns.tolist()
    assert left == ts[:50].tolist() + ts[55:].tolist()
    assert await backend.delete_range("/nope/never", 0, now) in (-1, 0)


async def test_concurrent_writers_and_readers_on_two_instances(store: Store) -> None:
    a, b = await store.open(), await store.open()
    per, batches = 50, 12

    async def writer(inst: StorageBackend, name: str) -> None:
        for k in range(batches):
            secs = np.arange(k * per, (k + 1) * per)
            await inst.write(Batch.single(name, at(*secs), secs.astype(np.float64)))

    seen: list[int] = []

    async def reader(inst: StorageBackend, name: str) -> None:
        for _ in range(batches):
            s = await inst.read(name, T0, T0 + 10**6 * S)
            assert np.all(np.diff(s.timestamps_ns) > 0)
            np.testing.assert_array_equal(s.values, (s.timestamps_ns - T0) // S)
            seen.append(len(s))
            await asyncio.sleep(0)

    names = [f"/c/w{i}" for i in range(4)]
    await asyncio.gather(
        *(writer(a if i % 2 else b, n) for i, n in enumerate(names)),
        *(reader(b if i % 2 else a, n) for i, n in enumerate(names)),
    )
    if a.atomic_writes:
        assert all(n % per == 0 for n in seen)  # whole batches only
    for n in names:
        for inst in (a, b):
            s = await inst.read(n, T0, T0 + 10**6 * S)
            assert s.timestamps_ns.tolist() == at(*range(per * batches)).tolist()


async def test_bad_sensor_name_rejects_whole_batch(backend: StorageBackend) -> None:
    batch = Batch.from_rows(["/ok/a", "no-slash", "/ok/b"], at(1, 2, 3), [1.0, 2.0, 3.0])
    with pytest.raises(PermanentStorageError, match="no-slash"):
        await backend.write(batch)
    registry = backend.metrics.service.registry  # type: ignore[attr-defined]
    labels = {"backend": backend.kind, "reason": "bad_name"}
    assert registry.get_sample_value("kelvin_storage_errors_total", labels) == 1
    assert not await backend.has_sensor("/ok/a")
    assert len(await backend.read("/ok/a", T0, T0 + 9 * S)) == 0


async def test_a_time_no_range_can_read_is_rejected(backend: StorageBackend) -> None:
    """int64's largest ns is the exclusive end of every range: stored, it would be lost."""
    batch = Batch.from_rows(["/end/a", "/end/b"], np.array([T0, 2**63 - 1]), [1.0, 2.0])
    with pytest.raises(PermanentStorageError, match="nothing stored"):
        await backend.write(batch)
    assert len(await backend.read("/end/a", T0, T0 + S)) == 0
    await backend.write(Batch.single("/end/b", [2**63 - 2], [3.0]))  # the last readable ns
    assert await backend.latest("/end/b") == (2**63 - 2, 3.0)


async def test_failure_mid_batch(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = await store.open()
    names = [f"/fail/a{i}" if i % 2 else f"/x/fail{i}" for i in range(40)]  # both shards
    batch = Batch.from_rows(names, at(*range(40)), np.arange(40.0))
    with inject_write_failure(backend, monkeypatch), pytest.raises(RetryableStorageError):
        await backend.write(batch)
    visible = sum(len(s) for s in (await backend.read_many(names, T0, T0 + 99 * S)).values())
    if backend.atomic_writes:
        assert visible == 0
    else:
        assert 0 <= visible < 40  # at-least-once: the caller retries the whole batch
    await backend.write(batch)
    await backend.write(batch)  # redelivery is idempotent
    got = await backend.read_many(names, T0, T0 + 99 * S)
    for i, n in enumerate(names):
        assert_series(got[n], at(i), np.array([float(i)]))


async def test_children_and_sensor_listing(backend: StorageBackend) -> None:
    names = ["/dc/row0/rack0/n0/power", "/dc/row0/rack0/n0", "/dc/row1/x", "/dc/row10/y", "/o"]
    await backend.write(Batch.from_rows(names, at(*range(5)), np.arange(5.0)))
    assert await backend.children("/") == [Child("/dc", False, True), Child("/o", True, False)]
    assert await backend.children("/dc/row0/rack0") == [Child("/dc/row0/rack0/n0", True, True)]
    assert await backend.children("/dc/row0/rack0/n0/power") == []
    assert await backend.sensors("/dc/row1") == ["/dc/row1/x"]
    assert await backend.sensors("/") == sorted(names)
    assert await backend.children("/nothing") == []


async def test_metadata_create_merge_list(backend: StorageBackend) -> None:
    await backend.put_metadata(SensorMetadata(name="/m/p", unit="W", interval_ms=1000))
    await backend.put_metadata(SensorMetadata(name="/m/p", scale=0.1, integrable=True))
    meta = await backend.get_metadata("/m/p")
    assert meta is not None
    assert (meta.unit, meta.scale, meta.interval_ms, meta.integrable) == ("W", 0.1, 1000, True)
    assert await backend.has_sensor("/m/p")  # metadata alone makes a sensor
    assert "/m/p" in await backend.sensors("/m")
    await backend.put_metadata(SensorMetadata(name="/m/q", public_name="q"))
    assert [m.name for m in await backend.list_metadata("/m")] == ["/m/p", "/m/q"]
    assert await backend.get_metadata("/m/none") is None


async def test_virtual_definitions(backend: StorageBackend) -> None:
    d = {"expression": "/a/b + /c/d", "unit": "W", "nested": {"k": [1, 2]}}
    await backend.put_virtual("/v/sum", d)
    assert await backend.get_virtual("/v/sum") == d
    await backend.put_virtual("/v/two", {"expression": "1"})
    assert set(await backend.list_virtual()) == {"/v/sum", "/v/two"}
    assert await backend.delete_virtual("/v/sum")
    assert not await backend.delete_virtual("/v/sum")
    assert await backend.get_virtual("/v/sum") is None


async def test_virtual_results_coverage_and_invalidation(backend: StorageBackend) -> None:
    await backend.put_virtual("/v/r", {"expression": "x"})
    ts = at(*range(0, 100, 10))
    await backend.write_virtual_results("/v/r", T0, T0 + 100 * S, ts, ts / S, computed_at_ns=7)
    ts2 = at(*range(100, 200, 10))
    await backend.write_virtual_results("/v/r", T0 + 100 * S, T0 + 200 * S, ts2, ts2 / S, 8)
    r = await backend.read_virtual_results("/v/r", T0 + 50 * S, T0 + 150 * S)
    assert r.covered == [(T0, T0 + 100 * S), (T0 + 100 * S, T0 + 200 * S)]
    assert r.computed_at_ns == [7, 8]
    assert_series(r.series, at(*range(50, 150, 10)), at(*range(50, 150, 10)) / S)

    await backend.invalidate_virtual("/v/r", T0 + 80 * S, T0 + 120 * S)
    r = await backend.read_virtual_results("/v/r", T0, T0 + 300 * S)
    assert r.covered == [(T0, T0 + 80 * S), (T0 + 120 * S, T0 + 200 * S)]
    assert r.computed_at_ns == [7, 8]
    kept = [*range(0, 80, 10), *range(120, 200, 10)]
    assert_series(r.series, at(*kept), at(*kept) / S)

    await backend.delete_virtual("/v/r")
    r = await backend.read_virtual_results("/v/r", T0, T0 + 300 * S)
    assert r.covered == [] and len(r.series) == 0


async def test_virtual_results_exact_values_and_edges(backend: StorageBackend) -> None:
    """Many points (several chunks), non-finite values, irregular and unsorted input,
    an invalidation that cuts one range in two, and one that drops everything."""
    await backend.put_virtual("/v/e", {"expression": "x"})
    n = 20_000
    ts = T0 + np.arange(n, dtype=np.int64) * S
    vs = np.random.default_rng(3).normal(0, 1e3, n) / 3
    vs[::97], vs[5], vs[6] = np.nan, np.inf, -np.inf
    await backend.write_virtual_results("/v/e", T0, T0 + n * S, ts, vs, 1)
    r = await backend.read_virtual_results("/v/e", T0 - S, T0 + (n + 1) * S)
    assert r.covered == [(T0, T0 + n * S)] and r.computed_at_ns == [1]
    assert r.series.timestamps_ns.tolist() == ts.tolist()
    assert r.series.values.tobytes() == vs.tobytes()  # bit-exact, NaN and infinities too

    cut = (T0 + 5000 * S + 1, T0 + 15_000 * S + 1)  # off-grid edges
    await backend.invalidate_virtual("/v/e", *cut)
    r = await backend.read_virtual_results("/v/e", T0, T0 + n * S)
    assert r.covered == [(T0, cut[0]), (cut[1], T0 + n * S)]
    keep = (ts < cut[0]) | (ts >= cut[1])
    assert r.series.timestamps_ns.tolist() == ts[keep].tolist()
    assert r.series.values.tobytes() == vs[keep].tobytes()

    # Irregular, unsorted, with a duplicate (the last one wins) and points outside the range.
    odd = at(7.5, 3, 1.25, 3, 12_000, -1)
    await backend.write_virtual_results("/v/e", *cut, odd + 5000 * S, np.arange(6.0), 2)
    r = await backend.read_virtual_results("/v/e", cut[0], cut[1])
    assert r.covered == [cut] and r.computed_at_ns == [2]
    assert_series(r.series, at(1.25, 3, 7.5) + 5000 * S, np.array([2.0, 3.0, 0.0]))

    await backend.invalidate_virtual("/v/e", -(2**63), 2**63 - 1)
    r = await backend.read_virtual_results("/v/e", -(2**63), 2**63 - 1)
    assert r.covered == [] and len(r.series) == 0


async def test_modified_since_reports_earliest_late_write(backend: StorageBackend) -> None:
    since = time.time_ns() - 1
    await backend.write(Batch.single("/ms/a", at(10, 11), [1.0, 2.0]))
    await backend.write(Batch.single("/ms/b", at(20), [1.0]))
    got = await backend.modified_since(["/ms/a", "/ms/b", "/ms/c"], since)
    assert got == {"/ms/a": T0 + 10 * S, "/ms/b": T0 + 20 * S}
    mark = time.time_ns()
    await backend.write(Batch.single("/ms/a", at(3, 30), [5.0, 6.0]))
    assert await backend.modified_since(["/ms/a", "/ms/b"], mark) == {"/ms/a": T0 + 3 * S}
    assert await backend.modified_since(["/ms/a"], time.time_ns()) == {}


async def test_modified_since_reports_a_deleted_range(backend: StorageBackend) -> None:
    await backend.write(Batch.single("/md/a", at(*range(10)), np.arange(10.0)))
    await backend.write(Batch.single("/md/b", at(*range(10)), np.arange(10.0)))
    mark = time.time_ns()
    await backend.delete_range("/md/a", T0 + 4 * S, T0 + 6 * S)
    await backend.delete_range("/md/b", T0 + 50 * S, T0 + 60 * S)  # nothing there
    got = await backend.modified_since(["/md/a", "/md/b"], mark)
    assert got.get("/md/a") == T0 + 4 * S
    if backend.kind == "sqlite":  # it counts what it deletes, so it logs only a deletion
        assert "/md/b" not in got
    mark = time.time_ns()
    await backend.truncate_before(T0 + 2 * S, prefix="/md")
    await backend.put_metadata(SensorMetadata(name="/md/a", ttl_ms=1))
    await backend.apply_retention(T0 + 3 * S)
    left = await backend.read("/md/a", T0, T0 + 99 * S)
    assert left.timestamps_ns.tolist() == at(3, 6, 7, 8, 9).tolist()
    assert await backend.modified_since(["/md/a", "/md/b"], mark) == {}


async def test_jobs_start_then_end(backend: StorageBackend) -> None:
    start = JobRecord(job_id="42", user_id="ada", start_ns=T0, nodes=("/n/1", "/n/2"))
    other = JobRecord(job_id="43", start_ns=T0 + 500 * S, end_ns=T0 + 600 * S, nodes=("/n/3",))
    await backend.put_job(start)
    await backend.put_job(other)
    running = await backend.jobs(T0 + 1000 * S, T0 + 2000 * S)
    assert [j.job_id for j in running] == ["42"] and running[0].running
    assert [j.job_id for j in await backend.jobs(node="/n/3")] == ["43"]
    await backend.put_job(JobRecord(job_id="42", start_ns=0, end_ns=T0 + 100 * S))
    (job,) = await backend.jobs(node="/n/1")
    assert (job.start_ns, job.end_ns, job.user_id, job.nodes) == (
        T0,
        T0 + 100 * S,
        "ada",
        ("/n/1", "/n/2"),
    )
    assert await backend.jobs(T0 + 1000 * S, T0 + 2000 * S) == []
    assert [j.job_id for j in await backend.jobs(T0 + 50 * S, T0 + 550 * S)] == ["42", "43"]


async def test_one_job_by_its_key(backend: StorageBackend) -> None:
    """get_job gives the record jobs() gives (start and end merged), per domain, or None."""
    await backend.put_job(JobRecord(job_id="7", user_id="ada", start_ns=T0, nodes=("/n/1",)))
    await backend.put_job(JobRecord(job_id="7", domain_id="slurm", start_ns=T0 + S))
    await backend.put_job(JobRecord(job_id="70", start_ns=T0 + 2 * S))
    running = await backend.get_job("7")
    assert running is not None and running.running and running.nodes == ("/n/1",)
    await backend.put_job(JobRecord(job_id="7", start_ns=0, end_ns=T0 + 100 * S))
    (listed,) = [j for j in await backend.jobs() if (j.domain_id, j.job_id) == ("default", "7")]
    assert await backend.get_job("7") == listed
    assert listed.end_ns == T0 + 100 * S and listed.user_id == "ada"
    other = await backend.get_job("7", "slurm")
    assert other is not None and other.start_ns == T0 + S and other.running
    assert await backend.get_job("8") is None and await backend.get_job("7", "none") is None
    assert await backend.get_job("7 ") is None  # the exact id, not a prefix or a pattern
    odd = JobRecord(job_id="a'b\\c\"d", domain_id="x y", start_ns=T0)
    await backend.put_job(odd)
    assert await backend.get_job("a'b\\c\"d", "x y") == odd


async def test_latest_unknown_and_read_many(backend: StorageBackend) -> None:
    assert await backend.latest("/l/x") is None
    assert len(await backend.read("/l/x", 0, 2**62)) == 0
    assert not await backend.has_sensor("/l/x")
    await backend.write(Batch.single("/l/x", at(1, 9, 5), [1.0, 9.0, 5.0]))
    assert await backend.latest("/l/x") == (T0 + 9 * S, 9.0)
    await backend.write(Batch.single("/l/x", at(9), [99.0]))
    assert await backend.latest("/l/x") == (T0 + 9 * S, 99.0)
    got = await backend.read_many(["/l/x", "/l/none"], T0, T0 + 6 * S)
    assert_series(got["/l/x"], at(1, 5), np.array([1.0, 5.0]))
    assert len(got["/l/none"]) == 0
    assert (await backend.stats())["backend"] == backend.kind
    assert await backend.ping()
