"""Group scheduling: wall-clock alignment, timeouts, skipped beats, isolation of slow sources."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np

from services.common.readings import Float64Array
from services.pusher.cache import SensorCache
from services.pusher.metrics import PusherMetrics
from services.pusher.plugins.base import Group, GroupOptions, Sensor
from services.pusher.sampling import Chunk, GroupRunner, next_tick_ns
from tests.pusher.conftest import Collector, make_config, running
from tests.support.servers import Mosquitto

MS = 1_000_000


def test_next_tick_is_the_next_multiple_of_the_interval_strictly_after_now() -> None:
    assert next_tick_ns(1_000 * MS, 100 * MS) == 1_100 * MS
    assert next_tick_ns(1_000 * MS + 1, 100 * MS) == 1_100 * MS
    assert next_tick_ns(1_099 * MS, 100 * MS) == 1_100 * MS
    # Two nodes whose clocks read different times land on the same instant.
    assert next_tick_ns(1_234_567 * MS, 1000 * MS) == next_tick_ns(1_234_001 * MS, 1000 * MS)


class SlowGroup(Group):
    """Blocks in read() until released (a hung device)."""

    blocking = True

    def __init__(self, name: str, sensors: list[Sensor], options: GroupOptions) -> None:
        super().__init__(name, sensors, options)
        self.release = threading.Event()
        self.calls = 0

    def read(self, timestamp_ns: int) -> Float64Array:
        self.calls += 1
        self.release.wait(10)
        return np.ones(len(self.sensors))


class FastGroup(Group):
    def read(self, timestamp_ns: int) -> Float64Array:
        return np.full(len(self.sensors), float(timestamp_ns // MS))


class Sink(list[Chunk]):
    """Chunks a runner hands over, with an event to await the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    def __call__(self, chunk: Chunk) -> None:
        self.append(chunk)
        self.event.set()

    async def until(self, n: int) -> None:
        async with asyncio.timeout(15):
            while len(self) < n:
                self.event.clear()
                await self.event.wait()


def _runner(group: Group, sink: Sink, cache: SensorCache, m: PusherMetrics) -> GroupRunner:
    return GroupRunner("t", group, cache, sink, m)


async def test_a_hung_source_times_out_skips_beats_and_does_not_delay_others() -> None:
    cache, metrics = SensorCache(), PusherMetrics()
    opts = GroupOptions(interval_ms=50, timeout_ms=60)
    slow = SlowGroup("slow", [Sensor("/t/slow/a")], opts)
    fast = FastGroup("fast", [Sensor("/t/fast/a")], GroupOptions(interval_ms=50))
    slow_chunks, fast_chunks = Sink(), Sink()
    r_slow = _runner(slow, slow_chunks, cache, metrics)
    r_fast = _runner(fast, fast_chunks, cache, metrics)
    tasks = [asyncio.create_task(r.run()) for r in (r_slow, r_fast)]
    try:
        await fast_chunks.until(12)
        assert r_slow.timeouts >= 1 and r_slow.skipped >= 1
        assert slow.calls == 1, "no new read while the hung one occupies the worker"
        assert r_slow.last_error and "timed out" in r_slow.last_error
        slow.release.set()
        await slow_chunks.until(1)
    finally:
        slow.release.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    ts = np.concatenate([c.ts for c in fast_chunks])
    assert np.all(ts % (50 * MS) == 0)
    assert np.all(np.diff(ts) == 50 * MS), "the fast group never missed a beat"
    assert np.all(np.asarray(slow_chunks[0].ts) % (50 * MS) == 0)


class OverrunGroup(Group):
    blocking = True

    def read(self, timestamp_ns: int) -> Float64Array:
        time.sleep(0.12)  # longer than the 50 ms interval, shorter than the timeout
        return np.zeros(len(self.sensors))


async def test_an_overrunning_read_skips_the_missed_beats_and_counts_them() -> None:
    chunks = Sink()
    group = OverrunGroup("o", [Sensor("/t/o/a")], GroupOptions(interval_ms=50, timeout_ms=1000))
    runner = _runner(group, chunks, SensorCache(), PusherMetrics())
    task = asyncio.create_task(runner.run())
    try:
        await chunks.until(3)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    ts = np.concatenate([c.ts for c in chunks])
    assert np.all(ts % (50 * MS) == 0)
    assert np.all(np.diff(ts) >= 100 * MS)
    assert runner.skipped >= 2 * (len(chunks) - 1)
    assert runner.timeouts == 0


async def test_two_pushers_started_at_different_times_sample_on_the_same_instants(
    tmp_path: Path, mosquitto_broker: Mosquitto, collector: Collector
) -> None:
    def cfg(name: str) -> object:
        d = tmp_path / name
        d.mkdir()
        return make_config(
            d,
            {"prefix": f"/{name}", "plugins": {"tester": {"sensors": 1, "interval": 200}}},
            broker_port=mosquitto_broker.port,
        )

    async with running(cfg("a")):  # type: ignore[arg-type]
        await collector.wait_for(lambda: len(collector.readings.get("/a/tester/s0000", [])) >= 2)
        # Start the second one 70 ms past a grid instant, to be sure it is off-grid.
        now = time.time_ns()
        await asyncio.sleep(((now // (200 * MS) + 1) * 200 * MS + 70 * MS - now) / 1e9)
        async with running(cfg("b")):  # type: ignore[arg-type]
            await collector.wait_for(
                lambda: len(collector.readings.get("/b/tester/s0000", [])) >= 5
            )
    a = {t for t, _ in collector.readings["/a/tester/s0000"]}
    b = {t for t, _ in collector.readings["/b/tester/s0000"]}
    assert all(t % (200 * MS) == 0 for t in a | b)
    first_b, last_b = min(b), max(b)
    assert {t for t in a if first_b <= t <= last_b} == b
