"""Stored virtual results in SQLite: chunk layout against a model, and the 2 -> 3 migration."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.storage import virtual_chunks as vc
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from services.common.storage.sqlite.schema import SCHEMA_VERSION, TABLES_V2

_writes = st.tuples(
    st.just("write"),
    st.integers(0, 100),  # start
    st.integers(0, 40),  # length
    st.sampled_from([1, 2, 3, 0]),  # grid step; 0: irregular timestamps
    st.integers(0, 10**6),  # computed_at and seed
)
_drops = st.tuples(st.just("drop"), st.integers(0, 120), st.integers(0, 60), st.just(0), st.just(0))
ops = st.lists(st.one_of(_writes, _drops), min_size=1, max_size=25)


def _points(start: int, length: int, step: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if step:
        ts = np.arange(start - 2, start + length + 2, step, dtype=np.int64)  # some outside
    else:
        ts = np.unique(rng.integers(start - 2, start + length + 2, max(length, 1)))
    vs = rng.normal(0, 1e6, ts.shape[0])
    vs[rng.random(ts.shape[0]) < 0.2] = np.nan
    return ts, vs


def _trim(cover: list[tuple[int, int, int]], a: int, b: int) -> list[tuple[int, int, int]]:
    out = []
    for s, e, c in cover:
        if e <= a or s >= b or b <= a:
            out.append((s, e, c))
            continue
        if s < a:
            out.append((s, a, c))
        if e > b:
            out.append((b, e, c))
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=ops)
def test_results_match_a_model(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int, int, int]]
) -> None:
    """Writes over old results, adjacent small writes (chunk extension) and invalidations
    that cut chunks in two read back exactly like a dict and a list of ranges."""

    async def run() -> None:
        backend = SqliteStorage(SqliteSettings(path=tmp_path_factory.mktemp("v") / "k.sqlite"))
        await backend.open()
        points: dict[int, float] = {}
        cover: list[tuple[int, int, int]] = []
        try:
            for op, a, length, step, seed in ops:
                b = a + length
                if op == "write":
                    ts, vs = _points(a, length, step, seed)
                    await backend.write_virtual_results("/v", a, b, ts, vs, seed)
                    cover = _trim(cover, a, b) + ([(a, b, seed)] if b > a else [])
                    points = {t: v for t, v in points.items() if not a <= t < b}
                    points.update(
                        (t, v) for t, v in zip(ts.tolist(), vs.tolist(), strict=True) if a <= t < b
                    )
                else:
                    await backend.invalidate_virtual("/v", a, b)
                    cover = _trim(cover, a, b)
                    points = {t: v for t, v in points.items() if not a <= t < b}
                for lo, hi in ((-(2**63), 2**63 - 1), (30, 70)):
                    got = await backend.read_virtual_results("/v", lo, hi)
                    want = sorted((s, e, c) for s, e, c in cover if e > lo and s < hi)
                    assert got.covered == [(s, e) for s, e, _ in want]
                    assert got.computed_at_ns == [c for _, _, c in want]
                    pts = sorted((t, v) for t, v in points.items() if lo <= t < hi)
                    assert got.series.timestamps_ns.tolist() == [t for t, _ in pts]
                    want_vs = np.array([v for _, v in pts], dtype=np.float64)
                    assert got.series.values.tobytes() == want_vs.tobytes()  # bit-exact, NaN too
        finally:
            await backend.close()

    saved = vc.CHUNK_POINTS
    vc.CHUNK_POINTS = 4  # every write crosses chunk boundaries
    try:
        asyncio.run(run())
    finally:
        vc.CHUNK_POINTS = saved


async def test_small_adjacent_writes_extend_one_chunk(tmp_path: Path) -> None:
    backend = SqliteStorage(SqliteSettings(path=tmp_path / "k.sqlite"))
    await backend.open()
    for k in range(50):  # a dashboard storing 10 points per refresh
        ts = np.arange(k * 10, k * 10 + 10, dtype=np.int64)
        await backend.write_virtual_results("/v", k * 10, k * 10 + 10, ts, ts / 2.0, k)
    assert (await backend.stats())["virtual_points"] == 500
    r = await backend.read_virtual_results("/v", 0, 1000)
    assert len(r.covered) == 50
    assert r.series.timestamps_ns.tolist() == list(range(500))
    np.testing.assert_array_equal(r.series.values, np.arange(500) * 0.5)
    r.series.values[0] = 1.0  # results are ordinary writable arrays
    await backend.close()
    con = sqlite3.connect(tmp_path / "k.sqlite")
    assert con.execute("SELECT COUNT(*), MIN(enc) FROM virtual_chunks").fetchone() == (1, vc.GRID)
    con.close()


async def test_migrates_version_2_virtual_points(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite"
    con = sqlite3.connect(path)
    for stmt in TABLES_V2:
        con.execute(stmt)
    con.execute("INSERT INTO meta_kv VALUES ('schema_version', '2')")
    con.execute("INSERT INTO virtual_defs VALUES ('/v', ?)", (json.dumps({"expression": "1"}),))
    n = 20_000  # more than one chunk
    con.executemany(
        "INSERT INTO virtual_points VALUES ('/v', ?, ?)",
        [(t, None if t % 7 == 0 else t / 3) for t in range(n)],
    )
    con.executemany("INSERT INTO virtual_points VALUES ('/w', ?, ?)", [(5, 1.5), (9, -2.0)])
    con.executemany(
        "INSERT INTO virtual_ranges VALUES (?,?,?,?)",
        [("/v", 0, 10_000, 11), ("/v", 10_000, n, 12), ("/w", 0, 10, 13)],
    )
    con.commit()
    con.close()

    backend = SqliteStorage(SqliteSettings(path=path))
    await backend.open()
    r = await backend.read_virtual_results("/v", 0, n)
    assert r.covered == [(0, 10_000), (10_000, n)] and r.computed_at_ns == [11, 12]
    assert r.series.timestamps_ns.tolist() == list(range(n))
    want = np.array([np.nan if t % 7 == 0 else t / 3 for t in range(n)])
    assert r.series.values.tobytes() == want.tobytes()
    w = await backend.read_virtual_results("/w", 0, 10)
    assert w.series.timestamps_ns.tolist() == [5, 9] and w.series.values.tolist() == [1.5, -2.0]
    assert await backend.get_virtual("/v") == {"expression": "1"}
    stats = await backend.stats()
    assert stats["schema_version"] == SCHEMA_VERSION == 3 and stats["virtual_points"] == n + 2
    await backend.close()
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "virtual_points" not in tables and "virtual_chunks" in tables
    con.close()
