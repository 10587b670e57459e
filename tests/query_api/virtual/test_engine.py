"""Lazy evaluation with write-back: counted storage reads, partial ranges, late data, settling."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.common import times
from services.common.readings import Series
from services.common.storage.base import StorageBackend
from services.query_api.app import create_service
from services.query_api.virtual.define import VirtualIn
from services.query_api.virtual.engine import Engine
from tests.query_api.conftest import PUE, T0, Api, S, admin_client, make_config, mixed_inputs


class CountingStorage:
    """The real backend, with a count of reading reads (a wrapper, not a fake)."""

    def __init__(self, inner: StorageBackend) -> None:
        self.inner = inner
        self.reads: list[str] = []

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        self.reads.append(sensor)
        return await self.inner.read(sensor, start_ns, end_ns)

    async def read_many(self, sensors: list[str], start_ns: int, end_ns: int) -> dict[str, Series]:
        self.reads.extend(sensors)
        return await self.inner.read_many(sensors, start_ns, end_ns)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def counting(api: Api) -> CountingStorage:
    wrapped = CountingStorage(api.storage)
    api.service.ctx.attach(wrapped)  # type: ignore[arg-type]
    return wrapped


def metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


async def test_second_query_reads_no_input(api: Api, counting: CountingStorage) -> None:
    await mixed_inputs(api)
    assert (
        await api.client.put("/api/v1/virtual/pue", json={"expression": PUE})
    ).status_code == 200
    counting.reads.clear()  # defining estimates the inputs' intervals from their readings
    first = await api.values("/pue", 0, 11)
    assert sorted(counting.reads) == ["/a/power", "/b/power", "/it/power"]
    counting.reads.clear()
    second = await api.values("/pue", 0, 11)
    assert counting.reads == [] and second == first
    m = (await api.client.get("/metrics")).text
    assert metric(m, "kelvin_query_api_virtual_points_computed_total") == 11
    assert metric(m, "kelvin_query_api_virtual_points_reused_total") == 11


async def test_stored_results_serve_a_fresh_engine(api: Api, counting: CountingStorage) -> None:
    """What a restarted (or another) query API finds: the written-back results, not memory."""
    await mixed_inputs(api)
    await api.client.put("/api/v1/virtual/pue", json={"expression": PUE})
    first = await api.values("/pue", 0, 11)
    engine = api.service.ctx.virtual
    assert isinstance(engine, Engine)
    await engine.writer.flush()
    stored = await api.storage.read_virtual_results("/pue", T0, T0 + 11 * S)
    assert stored.covered == [(T0, T0 + 11 * S)] and len(stored.series) == 11
    api.service.ctx.attach(counting)  # type: ignore[arg-type]  # a new engine, empty memory
    counting.reads.clear()
    assert await api.values("/pue", 0, 11) == first
    assert counting.reads == []


async def test_only_missing_sub_ranges_are_computed(api: Api, counting: CountingStorage) -> None:
    await mixed_inputs(api)
    await api.client.put("/api/v1/virtual/pue", json={"expression": PUE})
    await api.values("/pue", 3, 6)  # t = 3, 4, 5
    whole = await api.values("/pue", 0, 11)
    assert whole == pytest.approx([3.0, 4.1, 5.2, 3.8, 2.4, 3.5, 4.6, 4.7, 4.8, 5.9, 7.0])
    m = (await api.client.get("/metrics")).text
    # 3 points, then the 3 + 5 around them; the middle three are reused
    assert metric(m, "kelvin_query_api_virtual_points_computed_total") == 11
    assert metric(m, "kelvin_query_api_virtual_points_reused_total") == 3


async def test_late_data_invalidates_affected_results(api: Api, counting: CountingStorage) -> None:
    await mixed_inputs(api)
    await api.client.put("/api/v1/virtual/pue", json={"expression": PUE})
    await api.client.put("/api/v1/virtual/pue2", json={"expression": '"/pue" * 2'})
    before = await api.values("/pue2", 0, 11)
    counting.reads.clear()
    assert await api.values("/pue2", 0, 11) == before and counting.reads == []
    # a late reading of /b/power at t=5 (was interpolated as 200 W): 0.6 kW
    await api.write("/b/power", [5], [0.6])
    after = await api.values("/pue2", 0, 11)
    assert counting.reads  # recomputed from the inputs
    # t=5: (150 + 600) / 100 * 2 = 15; t=4 and t=6 keep their readings
    assert after[5] == pytest.approx(15.0)
    assert after[:5] == pytest.approx(before[:5]) and after[6:] == pytest.approx(before[6:])
    m = (await api.client.get("/metrics")).text
    assert metric(m, "kelvin_query_api_virtual_invalidations_total") >= 1


async def test_deleting_input_readings_invalidates_results(api: Api) -> None:
    await mixed_inputs(api)
    await api.client.put("/api/v1/virtual/pue", json={"expression": PUE})
    before = await api.values("/pue", 0, 11)
    await api.storage.delete_range("/b/power", T0 + 4 * S, T0 + 5 * S)  # its 0.1 kW at t=4
    after = await api.values("/pue", 0, 11)
    # /b/power now runs straight from 400 W at t=2 to 300 W at t=6
    assert after[3:6] == pytest.approx([(130 + 375) / 100, (140 + 350) / 100, (150 + 325) / 100])
    assert after[:3] == before[:3] and after[6:] == before[6:]


async def test_recent_results_are_not_stored_until_they_settle(tmp_path: Path) -> None:
    svc = create_service(make_config(tmp_path, virtual_settle_s=3600))
    await svc.start()
    try:
        async with admin_client(svc.port) as c:
            api = Api(svc, c)
            counting = CountingStorage(api.storage)
            svc.ctx.attach(counting)  # type: ignore[arg-type]
            now_s = (times.now_ns() - T0) / S
            await api.write("/a/power", now_s - np.arange(10, 0, -1), np.arange(10.0), unit="W")
            await c.put("/api/v1/virtual/x", json={"expression": '"/a/power" * 2'})
            params = {"sensor": "/x", "start": "now-20s", "end": "now"}
            assert (await c.get("/api/v1/readings", params=params)).json()["count"] > 0
            counting.reads.clear()
            await c.get("/api/v1/readings", params=params)
            assert counting.reads == ["/a/power"]  # nothing was stored: computed again
    finally:
        await svc.stop()


async def test_answers_share_read_only_arrays_with_the_memory_tier(api: Api) -> None:
    await mixed_inputs(api)
    await api.client.put("/api/v1/virtual/pue", json={"expression": PUE})
    engine = api.service.ctx.virtual
    assert isinstance(engine, Engine)
    first = await engine.evaluate("/pue", T0, T0 + 11 * S)
    with pytest.raises(ValueError, match="read-only"):
        first.values[0] = 0.0
    again = await engine.evaluate("/pue", T0, T0 + 11 * S)
    assert again.values.tolist() == first.values.tolist()


async def test_ranges_at_the_edge_of_int64_keep_their_grid(api: Api) -> None:
    await api.write("/a/p", [0, 1], [1.0, 2.0])
    await api.client.put("/api/v1/virtual/d", json={"expression": 'delta("/a/p")'})
    engine = api.service.ctx.virtual
    assert isinstance(engine, Engine)
    start = times.parse_time("1677-09-21T00:12:44Z")  # under a second after int64's first ns
    with np.errstate(over="raise"):  # the step before the first point must not wrap around
        s = await engine.evaluate("/d", start, start + 5 * S)
    # 00:12:44 would need 00:12:43, before int64's first ns (00:12:43.145224192)
    assert s.timestamps_ns.tolist() == [start + k * S for k in range(1, 5)]
    assert bool(np.isnan(s.values).all())


class GatedStorage(CountingStorage):
    """The real backend; the first read of each gated sensor waits for its release."""

    def __init__(self, inner: StorageBackend, *sensors: str) -> None:
        super().__init__(inner)
        self.entered = {s: asyncio.Event() for s in sensors}
        self.release = {s: asyncio.Event() for s in sensors}

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        entered = self.entered.get(sensor)
        if entered is not None and not entered.is_set():
            entered.set()
            await self.release[sensor].wait()
        return await self.inner.read(sensor, start_ns, end_ns)


class WatchedLock(asyncio.Lock):
    """An asyncio lock that tells when a task starts waiting for it."""

    def __init__(self) -> None:
        super().__init__()
        self.contended = asyncio.Event()

    async def acquire(self) -> bool:
        if self.locked():
            self.contended.set()
        return await super().acquire()


async def test_results_computed_before_a_redefinition_are_never_kept(api: Api) -> None:
    """A dashboard query of /d (reading /x, then /b) in flight while /x is redefined:
    neither the old /x results nor the /d results computed from them may be stored."""
    await api.write("/a/power", np.arange(11), np.arange(11.0), unit="W")
    await api.write("/b", np.arange(11), np.zeros(11), unit="W")
    await api.client.put("/api/v1/virtual/x", json={"expression": '"/a/power" * 2'})
    await api.client.put("/api/v1/virtual/d", json={"expression": '"/x" * 10 + "/b"'})
    gated = GatedStorage(api.storage, "/a/power", "/b")
    api.service.ctx.attach(gated)  # type: ignore[arg-type]
    engine = api.service.ctx.virtual
    assert isinstance(engine, Engine)
    lock = engine._locks["/x"] = WatchedLock()
    old = asyncio.create_task(engine.evaluate("/d", T0, T0 + 11 * S))
    await gated.entered["/a/power"].wait()  # /d -> /x is reading /a/power
    redefine = asyncio.create_task(engine.put("/x", VirtualIn(expression='"/a/power" * 3')))
    # the redefinition either waits for the evaluation of /x or is done already
    contended = asyncio.create_task(lock.contended.wait())
    await asyncio.wait([redefine, contended], return_when=asyncio.FIRST_COMPLETED)
    contended.cancel()
    gated.release["/a/power"].set()
    await gated.entered["/b"].wait()  # /d has the old /x and reads its second input
    await redefine
    gated.release["/b"].set()
    assert (await old).values.tolist() == [20.0 * k for k in range(11)]  # asked before
    await engine.writer.flush()
    for name in ("/x", "/d"):
        stored = await api.storage.read_virtual_results(name, T0, T0 + 11 * S)
        assert stored.covered == [], name
    want = [30.0 * k for k in range(11)]
    assert (await engine.evaluate("/d", T0, T0 + 11 * S)).values.tolist() == want
    api.service.ctx.attach(api.storage)  # a fresh engine: what storage holds now
    fresh = api.service.ctx.virtual
    assert isinstance(fresh, Engine)
    assert (await fresh.evaluate("/d", T0, T0 + 11 * S)).values.tolist() == want
