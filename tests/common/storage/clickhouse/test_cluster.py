"""The ClickHouse backend on a real cluster: 2 shards x 2 replicas + ZooKeeper, 5 processes.

Started once per session (``tests/support/clickhouse.py``); the module uses one
database, each test its own sensor prefix, and every test leaves every process
running again. Faults are real: SIGKILL of a replica, ZooKeeper stopped,
both replicas of a shard stopped, a response lost after the insert landed.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from services.collect_agent import spool_format as fmt
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.spool import Spool
from services.collect_agent.writer import Writer
from services.common.errors import RetryableStorageError
from services.common.readings import Batch
from services.common.sensors import SensorMetadata
from services.common.storage.clickhouse import ClickHouseStorage
from tests.support.clickhouse import ClickHouseCluster

T0 = 1_700_000_000 * 10**9
S = 10**9
_dbs = itertools.count()
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def cluster(clickhouse_cluster: ClickHouseCluster) -> ClickHouseCluster:
    return clickhouse_cluster


@pytest.fixture(scope="module")
def database(cluster: ClickHouseCluster) -> str:
    """One database for the module (ON CLUSTER DDL costs ~2 s); tests use their own prefix."""
    db = f"cl_{next(_dbs)}"

    async def create() -> None:
        st = ClickHouseStorage(cluster.settings(db))
        await st.open()
        await st.close()

    asyncio.run(create())
    return db


@pytest.fixture
async def store(cluster: ClickHouseCluster, database: str) -> AsyncIterator[ClickHouseStorage]:
    st = ClickHouseStorage(
        cluster.settings(
            database,
            timeout_s=10.0,
            retries=2,
            backoff_s=0.05,
            insert_quorum=2,
            insert_quorum_timeout_s=1.0,
            create_tables=False,  # created once by `database`; checked here
        )
    )
    await st.open()
    st.test_prefix = f"/t{next(_prefixes)}"  # type: ignore[attr-defined]
    try:
        yield st
    finally:
        await st.close()


def sensors(st: ClickHouseStorage) -> list[str]:
    p = st.test_prefix  # type: ignore[attr-defined]
    return [f"{p}/r{i // 10}/n{i % 10}/power" for i in range(40)]


def batch(st: ClickHouseStorage, k: int, per: int = 50) -> Batch:
    """Batch ``k``: ``per`` consecutive seconds of every sensor, values encode (k, sensor)."""
    names = sensors(st)
    ts = np.tile(T0 + (k * per + np.arange(per, dtype=np.int64)) * S, len(names))
    vs = np.repeat(np.arange(len(names), dtype=np.float64), per) + k * 1000
    offsets = np.arange(0, len(names) * per + 1, per, dtype=np.int64)
    return Batch(names, offsets, ts, vs)


def counts(cluster: ClickHouseCluster, st: ClickHouseStorage) -> list[tuple[int, int]]:
    """Per node: (physical rows, distinct (sensor, ts)) of the test's sensors there."""
    table = st.schema.local()
    p = st.test_prefix  # type: ignore[attr-defined]
    out = []
    for n in cluster.all_nodes:
        got = n.query(
            f"SELECT count(), uniqExact(sensor, ts) FROM {table} "
            f"WHERE substring(sensor, 1, {len(p) + 1}) = '{p}/'"
        ).split()
        out.append((int(got[0]), int(got[1])))
    return out


async def until(cond: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def write_until_stored(
    st: ClickHouseStorage, b: Batch, seen: dict[str, int] | None = None, deadline_s: float = 60
) -> None:
    """The writer's rule: retry a RetryableStorageError (same batch) until it is stored."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            await st.write(b)
            return
        except RetryableStorageError:
            if seen is not None:
                seen["failures"] += 1
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def lose_first_answer(
    st: ClickHouseStorage,
    monkeypatch: pytest.MonkeyPatch,
    meanwhile: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, int]:
    """The first readings INSERT lands, then its answer is lost (a read timeout);
    ``meanwhile`` runs in between. Returns the counter of lost answers."""
    lost = {"n": 0}
    for client in st.http.clients:
        real = client.post

        async def post(url: str, *, real: Any = real, **kw: Any) -> httpx.Response:
            resp = await real(url, **kw)
            query = kw.get("params", {}).get("query", "")
            if query.startswith(f"INSERT INTO {st.schema.name()} ") and lost["n"] == 0:
                lost["n"] += 1
                if meanwhile is not None:
                    await meanwhile()
                raise httpx.ReadTimeout("timed out waiting for the answer")
            return resp

        monkeypatch.setattr(client, "post", post)
    return lost


async def test_cluster_round_trip_and_last_write_wins(store: ClickHouseStorage) -> None:
    await store.write(Batch.single("/a/x", [T0 + 2 * S, T0 + S, T0 + S], [2.0, 1.0, 10.0]))
    await store.write(Batch.single("/a/x", [T0 + 2 * S], [20.0]))
    s = await store.read("/a/x", T0, T0 + 9 * S)
    assert s.timestamps_ns.tolist() == [T0 + S, T0 + 2 * S]
    assert s.values.tolist() == [10.0, 20.0]
    await store.write(batch(store, 0))
    got = await store.read_many(sensors(store), T0, T0 + 50 * S)
    assert {len(v) for v in got.values()} == {50}
    await store.put_metadata(SensorMetadata(name="/a/x", unit="W"))
    assert (await store.get_metadata("/a/x")).unit == "W"  # type: ignore[union-attr]
    assert (await store.sensors(store.test_prefix + "/r0")) == sensors(store)[:10]  # type: ignore[attr-defined]


async def test_kill_9_of_a_replica_mid_ingest_loses_and_duplicates_nothing(
    cluster: ClickHouseCluster, store: ClickHouseStorage
) -> None:
    victim = cluster.nodes[0][1]
    progress = {"acknowledged": 0, "failures": 0}

    async def ingest() -> None:  # the writer: each batch retried until stored
        for k in range(10):
            await write_until_stored(store, batch(store, k), progress)
            progress["acknowledged"] += 1

    task = asyncio.create_task(ingest())
    try:
        await until(lambda: progress["acknowledged"] >= 3)
        await asyncio.to_thread(victim.kill)
        await until(lambda: progress["failures"] > 0)  # quorum 2: no acknowledgement alone
        await asyncio.to_thread(victim.start)
        await task
    finally:
        task.cancel()
        if not victim.running:
            victim.start()
    acknowledged = progress["acknowledged"]
    assert acknowledged == 10
    cluster.wait_replicated(store.schema.local())
    per = len(batch(store, 0))
    rows = counts(cluster, store)
    # each shard's two replicas hold the same rows; the shards together hold every one, once
    assert rows[0] == rows[1] and rows[2] == rows[3]
    assert rows[0][0] + rows[2][0] == acknowledged * per  # no duplicate row anywhere
    assert rows[0][1] + rows[2][1] == acknowledged * per
    got = await store.read_many(sensors(store), T0, T0 + 10**6 * S)
    assert sum(len(v) for v in got.values()) == acknowledged * per
    np.testing.assert_array_equal(got[sensors(store)[7]].values[:50], np.full(50, 7.0))


async def test_zookeeper_down_the_agents_spool_holds_then_drains(
    cluster: ClickHouseCluster, store: ClickHouseStorage, tmp_path: Path
) -> None:
    """The collect agent's own spool and writer: inserts are refused while ZooKeeper is
    down (retryable, nothing quarantined, the spool holds them); all land once, after."""
    spool = Spool(tmp_path / "spool")
    await spool.open()
    writer = Writer(spool, store, AgentMetrics(), retry_max_s=0.2)
    writer.start()
    try:
        first = batch(store, 0)
        await spool.append([(first, fmt.encode_readings(first))])
        await asyncio.wait_for(spool.wait_empty(), 30)
        cluster.zk.stop()
        try:
            for k in (1, 2):
                b = batch(store, k)
                await spool.append([(b, fmt.encode_readings(b))])
            await until(lambda: writer.last_error is not None)
            assert re.search(r"code (242|999|225|319|159)", writer.last_error or "")
            assert spool.pending_readings == 2 * len(first)
            # reads need no ZooKeeper
            assert len(await store.read(sensors(store)[0], T0, T0 + 10**6 * S)) == 50
        finally:
            cluster.zk.start()
        await asyncio.wait_for(spool.wait_empty(), 60)
        assert not writer.quarantine_path.exists()
    finally:
        await writer.stop()
        await spool.close()
    cluster.wait_replicated(store.schema.local())
    rows = counts(cluster, store)
    assert rows[0][0] + rows[2][0] == rows[0][1] + rows[2][1] == 3 * len(first)  # once each


async def test_an_insert_whose_answer_is_lost_is_retried_once_stored(
    cluster: ClickHouseCluster, store: ClickHouseStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The insert lands, the answer is lost (a timeout); the retry is the same block,
    and the replicated table drops it as a duplicate."""
    lost = lose_first_answer(store, monkeypatch)
    await store.write(batch(store, 0))  # the backend's own retry
    assert lost["n"] == 1
    await store.write(batch(store, 1))
    cluster.wait_replicated(store.schema.local())
    rows = counts(cluster, store)
    assert rows[0][0] + rows[2][0] == 2 * len(batch(store, 0))  # physically once each


async def test_the_agents_writer_retries_a_lost_answer_with_the_same_records(
    cluster: ClickHouseCluster,
    store: ClickHouseStorage,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer to the writer's insert is lost and more readings arrive meanwhile:
    the retry resends the same records (an identical block, dropped), not a bigger batch."""
    monkeypatch.setattr(
        store.http, "settings", store.http.settings.model_copy(update={"retries": 0})
    )
    spool = Spool(tmp_path / "spool")
    await spool.open()
    writer = Writer(spool, store, AgentMetrics(), retry_max_s=0.05)

    async def more_arrives() -> None:
        more = batch(store, 1)
        await spool.append([(more, fmt.encode_readings(more))])

    lost = lose_first_answer(store, monkeypatch, more_arrives)
    first = batch(store, 0)
    await spool.append([(first, fmt.encode_readings(first))])
    writer.start()
    try:
        await asyncio.wait_for(spool.wait_empty(), 30)
    finally:
        await writer.stop()
        await spool.close()
    assert lost["n"] == 1
    cluster.wait_replicated(store.schema.local())
    rows = counts(cluster, store)
    assert rows[0][0] + rows[2][0] == rows[0][1] + rows[2][1] == 2 * len(first)


async def test_existing_tables_are_checked_not_created(
    cluster: ClickHouseCluster, tmp_path: Path
) -> None:
    st = ClickHouseStorage(cluster.settings("cl_absent", create_tables=False, retries=0))
    with pytest.raises(Exception, match=r"lacks tables|create_tables"):
        await st.open()


async def test_a_shard_down_is_an_error_not_a_partial_answer(  # last: shard 2 recovers after
    cluster: ClickHouseCluster, store: ClickHouseStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.write(batch(store, 0))
    names = sensors(store)
    before = await store.read_many(names, T0, T0 + 10**6 * S)
    assert all(len(v) == 50 for v in before.values())
    monkeypatch.setattr(
        store.http, "settings", store.http.settings.model_copy(update={"retries": 0})
    )
    for n in cluster.nodes[1]:
        n.kill()
    try:
        with pytest.raises(RetryableStorageError, match=r"code (279|210|1000)"):
            await store.read_many(names, T0, T0 + 10**6 * S)
        with pytest.raises(RetryableStorageError):
            await store.sensors("/")
    finally:
        for n in cluster.nodes[1]:
            n.start()
    after = await store.read_many(names, T0, T0 + 10**6 * S)  # reads need no ZooKeeper session
    assert {k: len(v) for k, v in after.items()} == {k: len(v) for k, v in before.items()}
