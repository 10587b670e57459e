"""SQLite specifics: chunk layout against a model, migrations, crash safety across processes."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sqlite3
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.errors import PermanentStorageError
from services.common.readings import Batch, Series
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from services.common.storage.sqlite.schema import SCHEMA_VERSION, TABLES_V1
from tests.support.chunks import count_decodes

ROOT = Path(__file__).resolve().parents[3]


def small(path: Path, **kw: int) -> SqliteStorage:
    """A backend with tiny chunks so that every layout transition happens quickly."""
    st_ = SqliteStorage(SqliteSettings(path=path, compact_writes=kw.get("writes", 2)))
    st_.store.seal_points = kw.get("seal", 16)
    st_.store.fanout = kw.get("fanout", 2)
    return st_


_NAMES = ["/a", "/b", "/c/d"]
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3),
            st.lists(st.integers(0, 120), min_size=1, max_size=6),
        ),
        st.tuples(st.just("compact"), st.none(), st.none()),
        st.tuples(
            st.just("delete"),
            st.sampled_from(_NAMES),
            st.tuples(st.integers(0, 120), st.integers(0, 120)),
        ),
    ),
    min_size=1,
    max_size=50,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops)
def test_layout_matches_a_dict_model(tmp_path_factory: pytest.TempPathFactory, ops: list) -> None:
    """Any mix of writes (out of order, duplicates), compactions and deletes reads back
    exactly like a dict with last-write-wins, whatever chunks and levels it went through."""

    async def run() -> None:
        backend = small(tmp_path_factory.mktemp("model") / "k.sqlite", seal=48, writes=2)
        await backend.open()
        model: dict[str, dict[int, float]] = {}
        counter = 0.0
        try:
            for op, name, arg in ops:
                if op == "write":  # the same timestamps for each sensor listed in ``name``
                    series = []
                    for sensor in name:
                        vals = np.arange(counter, counter + len(arg))
                        counter += len(arg)
                        series.append(Series(sensor, np.array(arg, np.int64), vals))
                        model.setdefault(sensor, {}).update(zip(arg, vals.tolist(), strict=True))
                    await backend.write(Batch.from_series(series))
                elif op == "compact":
                    await backend.compact()
                else:
                    a, b = arg
                    await backend.delete_range(name, a, b)
                    for t in [t for t in model.get(name, {}) if a <= t < b]:
                        del model[name][t]
                for s, pts in model.items():
                    got = await backend.read(s, 0, 121)
                    want = sorted(pts.items())
                    assert got.timestamps_ns.tolist() == [t for t, _ in want]
                    assert got.values.tolist() == [v for _, v in want]
                    mid = await backend.read(s, 20, 80)
                    assert mid.timestamps_ns.tolist() == [t for t, _ in want if 20 <= t < 80]
                    last = await backend.latest(s)
                    assert last == (want[-1] if want else None)
            assert compaction_failures(backend) == 0
        finally:
            await backend.close()

    asyncio.run(run())


def compaction_failures(backend: SqliteStorage) -> float:
    value = backend.metrics.service.registry.get_sample_value(
        "kelvin_storage_errors_total", {"backend": "sqlite", "reason": "compaction"}
    )
    return value or 0.0


async def test_chunks_seal_and_compress(tmp_path: Path) -> None:
    backend = small(tmp_path / "k.sqlite", seal=100, fanout=4, writes=1)
    await backend.open()
    for k in range(30):
        ts = np.arange(k * 10, k * 10 + 10)
        await backend.write(Batch.single("/s", ts, ts * 0.5))
    stats = await backend.stats()
    assert stats["sealed_chunks"] == 3 and stats["staged_readings"] == 0
    assert stats["readings"] == 300 and stats["bytes_per_reading"] < 16
    s = await backend.read("/s", 0, 1000)
    assert s.timestamps_ns.tolist() == list(range(300))
    s.values[0] = 1.0  # results are ordinary writable arrays
    await backend.close()


async def test_cut_points_are_where_chunks_begin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk starts (sealed or open) strictly inside the range; none for an unknown
    sensor. Slices cut there decode each chunk once and read the same as one read."""
    backend = small(tmp_path / "k.sqlite", seal=100, fanout=4, writes=1)
    await backend.open()
    for k in range(30):
        ts = np.arange(k * 10, k * 10 + 10)
        await backend.write(Batch.single("/s", ts, ts * 0.5))
    await backend.write(Batch.single("/open", np.array([5]), np.array([1.0])))
    assert await backend.cut_points("/s", 0, 1000) == [100, 200]
    assert await backend.cut_points("/s", 100, 250) == [200]
    assert await backend.cut_points("/s", 201, 1000) == []
    assert await backend.cut_points("/unknown", 0, 1000) == []
    assert await backend.cut_points("/open", 0, 1000) == [5]
    decoded = count_decodes(monkeypatch)
    parts = [await backend.read("/s", lo, hi) for lo, hi in itertools.pairwise([0, 100, 200, 1000])]
    assert len(decoded) == 3
    whole = await backend.read("/s", 0, 1000)
    assert np.concatenate([p.timestamps_ns for p in parts]).tolist() == whole.timestamps_ns.tolist()
    await backend.close()


async def test_migrates_the_version_1_layout(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    for stmt in TABLES_V1:
        con.execute(stmt)
    con.execute("INSERT INTO meta_kv VALUES ('schema_version', '1')")
    meta = json.dumps({"name": "/old/a", "unit": "W"})
    con.execute(
        "INSERT INTO sensors(id, name, metadata) VALUES (1, '/old/a', ?), (2, '/old/b', NULL)",
        (meta,),
    )
    rows = [(1, t, float(t)) for t in range(20_000)] + [(2, 5, None), (2, 6, float("inf"))]
    con.executemany("INSERT INTO readings VALUES (?,?,?)", rows)
    con.execute("INSERT INTO virtual_defs VALUES ('/v', '{\"expression\": \"1\"}')")
    con.commit()
    con.close()

    backend = SqliteStorage(SqliteSettings(path=path))
    await backend.open()
    a = await backend.read("/old/a", 0, 10**9)
    assert a.timestamps_ns.tolist() == list(range(20_000))
    np.testing.assert_array_equal(a.values, np.arange(20_000.0))
    b = await backend.read("/old/b", 0, 10)
    assert np.isnan(b.values[0]) and b.values[1] == np.inf
    assert (await backend.get_metadata("/old/a")).unit == "W"  # type: ignore[union-attr]
    assert await backend.get_virtual("/v") == {"expression": "1"}
    assert (await backend.stats())["schema_version"] == SCHEMA_VERSION
    await backend.write(Batch.single("/old/a", [20_000], [1.0]))
    assert await backend.latest("/old/a") == (20_000, 1.0)
    await backend.close()
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "readings" not in tables and "chunks" in tables
    assert con.execute("SELECT value FROM meta_kv WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    con.close()


async def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE meta_kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("INSERT INTO meta_kv VALUES ('schema_version', '99')")
    con.commit()
    con.close()
    with pytest.raises(PermanentStorageError, match="schema version 99"):
        await SqliteStorage(SqliteSettings(path=path)).open()


async def test_unwritable_location_is_a_permanent_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(PermanentStorageError, match="cannot create"):
        await SqliteStorage(SqliteSettings(path=tmp_path / "file" / "k.sqlite")).open()


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    from services.common.readings import Batch, Series
    from services.common.storage.settings import SqliteSettings
    from services.common.storage.sqlite import SqliteStorage

    async def main():
        backend = SqliteStorage(SqliteSettings(path=sys.argv[1], compact_writes=3))
        backend.store.seal_points = 256
        backend.store.fanout = 2
        await backend.open()
        names = [f"/crash/s{i}" for i in range(200)]
        k = 0
        while True:
            ts = np.full(200, k, dtype=np.int64)
            await backend.write(Batch.from_rows(names, ts, np.full(200, float(k))))
            print(k, flush=True)
            k += 1

    asyncio.run(main())
    """
)


async def test_kill_9_mid_write_keeps_every_committed_batch(tmp_path: Path) -> None:
    """Another process writes (and compacts) until SIGKILL; this one reads meanwhile.

    Reads from this process only ever see whole batches; after the kill the file
    opens cleanly and holds every batch the writer reported committed.
    """
    path = tmp_path / "crash.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WRITER, str(path), stdout=asyncio.subprocess.PIPE, env=env, cwd=ROOT
    )
    assert proc.stdout is not None
    reader = SqliteStorage(SqliteSettings(path=path))
    try:
        # The file exists once the first batch is committed.
        committed = int(await proc.stdout.readline())
        await reader.open()
        while committed < 60:
            got = await reader.read_many([f"/crash/s{i}" for i in range(0, 200, 37)], 0, 10**6)
            lengths = {len(s) for s in got.values()}
            assert len(lengths) == 1, lengths  # a batch is visible to every sensor or none
            committed = int(await proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await reader.close()
    after = SqliteStorage(SqliteSettings(path=path))
    await after.open()
    got = await after.read_many([f"/crash/s{i}" for i in range(200)], 0, 10**6)
    n = {len(s) for s in got.values()}
    assert len(n) == 1 and n.pop() >= committed + 1
    for s in got.values():
        assert s.timestamps_ns.tolist() == list(range(len(s)))
    await after.close()
