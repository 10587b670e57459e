"""Bounded under heavy queries: a cap on those running at once, a memory budget per answer.

A real query API on loopback over SQLite, real HTTP clients. Storage is wrapped only
to hold a read until the test lets it go (so a heavy query is in flight for sure) and
to record which ranges were read.
"""

from __future__ import annotations

import asyncio
import itertools
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.readings import Batch, Series
from services.common.storage.base import StorageBackend
from services.query_api.app import QueryApiService, create_service
from tests.query_api.conftest import T0, admin_client, make_config

S = 10**9


class HeldStorage:
    """Storage whose reads of ``/slow`` wait for ``gate``; every read is recorded."""

    def __init__(self, inner: StorageBackend) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.reads: list[tuple[str, int, int]] = []
        self.free = 0
        """Reads of ``/slow`` let through before the gate holds the rest."""

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        self.reads.append((sensor, start_ns, end_ns))
        if sensor == "/slow":
            self.entered.set()
            if self.free > 0:
                self.free -= 1
            else:
                await self.gate.wait()
        return await self.inner.read(sensor, start_ns, end_ns)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def _start(tmp_path: Path, **settings: Any) -> tuple[QueryApiService, HeldStorage]:
    svc = create_service(make_config(tmp_path, **settings))
    await svc.start()
    assert svc.storage is not None
    held = HeldStorage(svc.storage)
    svc.ctx.attach(held)  # type: ignore[arg-type]
    return svc, held


@pytest.fixture
async def capped(tmp_path: Path) -> AsyncIterator[tuple[QueryApiService, HeldStorage]]:
    svc, held = await _start(tmp_path, max_heavy_queries=1, heavy_query_wait_s=0.2)
    try:
        await held.inner.write(Batch.single("/slow", np.array([T0]), np.array([1.0])))
        await held.inner.write(Batch.single("/fast", np.array([T0]), np.array([2.0])))
        yield svc, held
    finally:
        held.gate.set()
        await svc.stop()


async def test_a_heavy_query_beyond_the_cap_gets_503_with_retry_after(
    capped: tuple[QueryApiService, HeldStorage],
) -> None:
    svc, held = capped
    params = {"start": str(T0), "end": str(T0 + S)}
    async with admin_client(svc.port, timeout=30) as c:
        first = asyncio.create_task(c.get("/api/v1/readings", params={"sensor": "/slow", **params}))
        await held.entered.wait()  # the cap's one slot is taken
        busy = await c.get("/api/v1/readings", params={"sensor": "/fast", **params})
        assert busy.status_code == 503 and busy.headers["retry-after"]
        assert busy.json()["error"] == "busy" and "max_heavy_queries" in busy.json()["detail"]
        prom = await c.get("/prometheus/api/v1/query", params={"query": "up"})
        assert prom.status_code == 503, "every data API shares the cap"
        # light requests are not capped
        assert (await c.get("/api/v1/sensors", params={"prefix": "/"})).status_code == 200
        held.gate.set()
        assert (await first).json()["values"] == [1.0]
        again = await c.get("/api/v1/readings", params={"sensor": "/fast", **params})
        assert again.status_code == 200 and again.json()["values"] == [2.0]
        metrics = (await c.get("/metrics")).text
        assert 'kelvin_query_api_queries_refused_total{reason="busy"} 2.0' in metrics


async def test_an_answer_over_its_budget_stops_early_with_400(tmp_path: Path) -> None:
    svc, held = await _start(tmp_path, response_memory_bytes=1 << 20)  # 32768 readings
    try:
        n = 100_000  # 100 Hz for 1000 s: the budget is spent a third of the way in
        ts = T0 + np.arange(n, dtype=np.int64) * 10_000_000
        await held.inner.write(Batch.single("/dense", ts, np.arange(n, dtype=np.float64)))
        start, end = T0, T0 + 1000 * S
        async with admin_client(svc.port, timeout=30) as c:
            params = {"sensor": "delta(/dense)", "start": str(start), "end": str(end)}
            r = await c.get("/api/v1/readings", params=params)
            assert r.status_code == 400 and r.json()["error"] == "over_budget", r.text
            assert "response_memory_bytes" in r.json()["detail"]
            reads = [(lo, hi) for s, lo, hi in held.reads if s == "/dense"]
            assert max(hi for _, hi in reads) < end, "it stopped before reading the whole range"
            # a plain sensor is streamed: the same range is answered whole
            plain = await c.get("/api/v1/readings", params={**params, "sensor": "/dense"})
            assert plain.status_code == 200 and plain.json()["count"] == n
            metrics = (await c.get("/metrics")).text
            assert 'kelvin_query_api_rejects_total{reason="over_budget"} 1.0' in metrics
            assert "kelvin_query_api_answers_spilled_total 1.0" in metrics
    finally:
        await svc.stop()


async def test_a_plain_answer_holds_a_bounded_part_of_itself(tmp_path: Path) -> None:
    """1M readings as JSON (~39 MB): the values wait in a file, not in memory.

    The same query on two services, one whose budget makes its values spill and one
    whose budget holds them; the traced peak of the query alone (storage's own caches
    warmed first) differs by about the values' size.
    """
    n = 1_000_000
    ts = T0 + np.arange(n, dtype=np.int64) * 1_000_000
    values = np.random.default_rng(1).random(n)
    peaks = {}
    for name, budget in (("spilled", 4 << 20), ("held", 1 << 30)):
        svc, held = await _start(tmp_path / name, response_memory_bytes=budget, stream_pieces=32)
        try:
            await held.inner.write(Batch.single("/big", ts, values))
            params = {"sensor": "/big", "start": str(T0), "end": str(T0 + n * 1_000_000)}
            url = f"http://127.0.0.1:{svc.port}/api/v1/readings"
            size = await asyncio.to_thread(_download, url, params)  # warms storage's caches
            tracemalloc.start()
            try:
                base, _ = tracemalloc.get_traced_memory()
                assert await asyncio.to_thread(_download, url, params) == size
                peaks[name] = tracemalloc.get_traced_memory()[1] - base
            finally:
                tracemalloc.stop()
        finally:
            await svc.stop()
    values_bytes = n * 18  # ~18 characters per value as JSON
    assert peaks["spilled"] < peaks["held"] - values_bytes // 2, peaks
    assert peaks["spilled"] < size / 2, (peaks, size)


def _download(url: str, params: dict[str, str]) -> int:
    size = 0
    with httpx.stream("GET", url, params=params, timeout=60) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            size += len(chunk)
    return size


async def test_freed_memory_goes_back_once_heavy_queries_are_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-to-back answers keep malloc's pages warm; a pause hands them back, once."""
    from services.query_api import limits

    trims: list[float] = []
    monkeypatch.setattr(limits, "_malloc_trim", lambda: trims.append(1.0))
    monkeypatch.setattr(limits, "TRIM_IDLE_S", 0.5)
    assert limits.tune_malloc(), "glibc's mallopt refused the thresholds"
    svc, held = await _start(tmp_path)
    try:
        await held.inner.write(Batch.single("/fast", np.array([T0]), np.array([2.0])))
        params = {"sensor": "/fast", "start": str(T0), "end": str(T0 + S)}
        async with admin_client(svc.port, timeout=30) as c:
            for _ in range(5):
                assert (await c.get("/api/v1/readings", params=params)).status_code == 200
            assert trims == [], "trimmed between back-to-back heavy queries"
            for _ in range(100):
                if trims:
                    break
                await asyncio.sleep(0.05)
            assert trims == [1.0]
            await asyncio.sleep(0.7)
            assert trims == [1.0], "trimmed again with nothing new to hand back"
    finally:
        await svc.stop()


def test_a_streamed_answer_is_cut_into_as_many_slices_as_pay_for_themselves() -> None:
    """A short range is one read; a longer one is probed and cut into up to ``count``
    slices of at least MIN_SLICE_READINGS; one that could outgrow the budget into at
    least ``count``, and as many as keep each slice within the budget."""
    from services.query_api import limits

    token = limits._account.set(limits.Account(512 << 20))
    try:
        ahead, count = 5, 8
        assert limits.probe_end(T0, T0 + S, ahead) is None  # 1 s: one slice even at 1 kHz
        for readings, want in ((0, 1), (10, 1), (100_000, 3), (1_000_000, 8)):
            rest = 500 * S  # within the budget even at 1 kHz (500k readings)
            got = limits.stream_slices(readings // 64, rest // 63, rest, count, ahead)
            assert got == want, (readings, got)
        long_ns = 10**6 * S  # 1M s: could hold 10^9 readings at 1 kHz
        probe = limits.probe_end(T0, T0 + long_ns, ahead)
        assert probe == T0 + long_ns // limits.PROBE_FRACTION
        assert limits.stream_slices(0, probe - T0, long_ns, count, ahead) == count
        per_slice = limits._slice_points(limits._account.get(), ahead)  # type: ignore[arg-type]
        dense = limits.stream_slices(10**8, probe - T0, long_ns - (probe - T0), count, ahead)
        assert dense > count and dense * per_slice >= 63 * 10**8
    finally:
        limits._account.reset(token)


def test_slices_begin_where_stored_blocks_do() -> None:
    """Each inner bound moves to the nearest cut within a quarter of the narrower slice
    beside it; the ends stay; a bound with no cut that near stays."""
    from services.query_api import limits

    assert limits.snap([0, 100, 200, 300], []) == [0, 100, 200, 300]
    assert limits.snap([0, 100, 200, 300], [90, 130, 226]) == [0, 90, 200, 300]
    assert limits.snap([0, 100, 200, 300], [-5, 0, 104, 196, 300, 400]) == [0, 104, 196, 300]
    assert limits.snap([0, 100], [50]) == [0, 100]
    assert limits.snap([0, 10, 1000], [3, 12, 500]) == [0, 12, 1000]  # the probe: reach 2


@settings(max_examples=200, deadline=None)
@given(
    widths=st.lists(st.integers(1, 10**6), min_size=1, max_size=20),
    cuts=st.lists(st.integers(-(10**6), 3 * 10**7), max_size=60),
)
def test_snapped_slices_keep_their_order_and_size(widths: list[int], cuts: list[int]) -> None:
    from services.query_api import limits

    bounds = np.cumsum([0, *widths]).tolist()
    got = limits.snap(bounds, sorted(set(cuts)))
    assert got[0] == bounds[0] and got[-1] == bounds[-1]
    assert all(a < b for a, b in itertools.pairwise(got))
    assert len(got) == len(bounds)
    assert all(b in cuts or b in bounds for b in got)
    for (a, b), (c, d) in zip(itertools.pairwise(bounds), itertools.pairwise(got), strict=True):
        assert d - c <= (b - a) * 3 // 2, (bounds, got)


@pytest.mark.parametrize("fmt", ["json", "csv"])
async def test_a_client_that_goes_away_mid_answer_frees_its_slot_and_work(
    tmp_path: Path, fmt: str
) -> None:
    """A client takes the first slice of a 400k-reading answer and closes the socket while
    the next slices are being read: they are cancelled (not left to finish for nobody),
    the one heavy-query slot is free for the next request, and that answer is whole."""
    from tests.query_api.conftest import headers

    n = 400_000
    svc, held = await _start(tmp_path, max_heavy_queries=1, heavy_query_wait_s=0.2)
    try:
        ts = T0 + np.arange(n, dtype=np.int64) * S
        for name in ("/slow", "/big"):
            await held.inner.write(Batch.single(name, ts, np.arange(n, dtype=np.float64) / 8))
        span = {"start": str(T0), "end": str(T0 + n * S), "format": fmt}
        before = set(asyncio.all_tasks())
        held.free = 1  # the first slice (the density probe) is read; the rest wait
        auth = "".join(f"{k}: {v}\r\n" for k, v in headers().items())
        query = "&".join(f"{k}={v}" for k, v in {"sensor": "/slow", **span}.items())
        reader, writer = await asyncio.open_connection("127.0.0.1", svc.port)
        writer.write(
            f"GET /api/v1/readings?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode()
        )
        got = await reader.read(4096)
        assert got.startswith(b"HTTP/1.1 200"), got[:100]
        for _ in range(200):  # the next slices start once the first is sent
            if len(jobs := _jobs(before)) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(jobs) >= 2, "slices were not read ahead: the test would prove nothing"
        writer.transport.abort()  # gone, with most of the answer unsent
        async with admin_client(svc.port, timeout=30) as c:
            params = {"sensor": "/big", **span}
            for _ in range(100):  # the server sees the client gone at its next event
                r = await c.get("/api/v1/readings", params=params)
                if r.status_code != 503:
                    break
            assert r.status_code == 200, r.text[:200]
            if fmt == "json":
                body = r.json()
                assert body["count"] == n and body["timestamps_ns"][-1] == int(ts[-1])
                assert body["values"][-1] == (n - 1) / 8
            else:
                lines = r.text.splitlines()
                assert len(lines) == n + 1 and lines[-1].endswith(f",{(n - 1) / 8}")
        assert all(t.cancelled() for t in jobs), jobs
    finally:
        held.gate.set()
        await svc.stop()


def _jobs(before: set[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    """Slices of a streamed answer still being read or encoded (stream.encoded's jobs)."""
    return [
        t
        for t in asyncio.all_tasks() - before
        if not t.done() and "encoded.<locals>.job" in repr(t.get_coro())
    ]
