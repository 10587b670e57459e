"""Rollups on a real clickhouse-server, read through the query API's Reader like every resample."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import numpy as np
import pytest

from services.common.readings import Batch
from services.common.storage.clickhouse import ClickHouseStorage, rollups
from services.query_api.catalog import Catalog
from services.query_api.query import Reader
from services.query_api.spec import parse
from tests.support.clickhouse import ClickHouse

H = 3600 * 10**9
M = 60 * 10**9
T0 = 1_700_000_000 // 3600 * H  # on an hour
_dbs = itertools.count()


@pytest.fixture
async def backend(clickhouse_server: ClickHouse) -> AsyncIterator[ClickHouseStorage]:
    st = ClickHouseStorage(clickhouse_server.settings(f"rollup_{next(_dbs)}"))
    await st.open()
    try:
        yield st
    finally:
        await st.close()


def readings() -> Batch:
    """Three hours at 1 s, in two writes' worth of shuffled order, with NaN and infinities."""
    ts = T0 + np.arange(3 * 3600, dtype=np.int64) * 10**9
    vs = np.round(np.random.default_rng(5).normal(200, 20, ts.shape[0]), 2)
    vs[::601] = np.nan
    vs[7] = np.inf
    return Batch.single("/r/p", ts, vs)


async def answers(backend: ClickHouseStorage, text: str, step: int, start: int, end: int) -> list:
    reader = Reader(backend, Catalog(backend))
    out = []
    for bucket in ("min", "max", "avg", "sum", "count"):
        (r,) = await reader.run(parse(text), start, end, step, bucket)
        out.append((bucket, r.unit, r.timestamps_ns.tolist(), r.values))
    return out


def same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (ba, ua, ta, va), (bb, ub, tb, vb) in zip(a, b, strict=True):
        assert (ba, ua, ta) == (bb, ub, tb)
        if ba in ("min", "max", "count"):
            np.testing.assert_array_equal(va, vb)
        else:
            np.testing.assert_allclose(va, vb, rtol=1e-12)


async def test_resampled_reads_from_rollups_equal_the_raw_path(
    backend: ClickHouseStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = readings()
    half = len(b) // 2
    await backend.write(Batch.single("/r/p", b.timestamps_ns[half:], b.values[half:]))
    await backend.write(Batch.single("/r/p", b.timestamps_ns[:half], b.values[:half]))
    cases = [
        (H, T0, T0 + 3 * H),  # hourly rollup
        (15 * M, T0 + 5 * M, T0 + 2 * H),  # minute rollup, unaligned to the hour
        (2 * H, T0, T0 + 4 * H),
    ]
    for step, start, end in cases:
        assert rollups.pick(start, end, step) is not None
        rolled = await answers(backend, "/r/p", step, start, end)
        with monkeypatch.context() as m:
            m.setattr(backend, "settings", backend.settings.model_copy(update={"rollups": False}))
            raw = await answers(backend, "/r/p", step, start, end)
        same(rolled, raw)


async def test_rollups_outlive_the_raw_readings(
    backend: ClickHouseStorage, clickhouse_server: ClickHouse
) -> None:
    await backend.write(readings())
    before = await answers(backend, "/r/p", H, T0, T0 + 3 * H)
    # what a raw TTL does: the readings are gone, the hourly answers stay
    clickhouse_server.query(f"ALTER TABLE {backend.schema.local()} DELETE WHERE 1", timeout=60)
    await backend._await_mutations("")
    assert len(await backend.read("/r/p", T0, T0 + 3 * H)) == 0
    same(await answers(backend, "/r/p", H, T0, T0 + 3 * H), before)


async def test_delete_range_rebuilds_the_rollups_it_touches(backend: ClickHouseStorage) -> None:
    await backend.write(readings())
    await backend.delete_range("/r/p", T0 + 30 * M + 10**9 // 2, T0 + 90 * M)  # off the grid
    rolled = await answers(backend, "/r/p", M, T0, T0 + 3 * H)
    backend.settings = backend.settings.model_copy(update={"rollups": False})
    same(rolled, await answers(backend, "/r/p", M, T0, T0 + 3 * H))


def test_pick_needs_a_step_and_range_on_the_rollup_grid() -> None:
    assert rollups.pick(T0, T0 + H, H) == "1h"
    assert rollups.pick(T0 + M, T0 + H, 2 * M) == "1m"
    assert rollups.pick(T0 + 1, T0 + H, H) is None  # unaligned start: the raw path
    assert rollups.pick(T0, T0 + H, 90 * 10**9) is None  # 90 s is no multiple of a minute
