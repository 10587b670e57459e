"""Publishing against real mosquitto brokers: outage buffering, bounds, failover, bursts."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from services.pusher import spool as spool_file
from services.pusher.app import PusherService
from tests.pusher.conftest import Collector, make_config, running
from tests.support.servers import Mosquitto, free_port, require_binary, wait_port


class PersistentMosquitto:
    """A real mosquitto that keeps sessions across restarts (persistence on disk).

    The test's subscriber uses a persistent session, so messages the broker takes
    while that subscriber is reconnecting are queued for it, not lost: what the
    test observes is the pusher's delivery, not a subscriber race.
    """

    def __init__(self, workdir: Path) -> None:
        self.binary = require_binary("mosquitto", "mosquitto")
        self.port = free_port()
        self.conf = workdir / "mosquitto-persistent.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"
            "max_queued_messages 0\nmax_inflight_messages 0\npersistence true\n"
            f"persistence_location {workdir}/\nautosave_interval 3600\n"
            # As root mosquitto would switch to user 'mosquitto', which cannot write here.
            + ("user root\n" if os.geteuid() == 0 else "")
        )
        self.log = workdir / "mosquitto-persistent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PersistentMosquitto:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT
            )
        wait_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: mosquitto saves its sessions, then exits
            self.proc.wait(10)
        self.proc = None


def grid_gaps(points: list[tuple[int, float]], step_ns: int) -> int:
    """How many instants of the ``step_ns`` grid between the first and last point have none."""
    ts = sorted(t for t, _ in points)
    return (ts[-1] - ts[0]) // step_ns + 1 - len(ts)


async def _between_cycles(
    svc: PusherService, col: Collector, interval_ns: int = 100_000_000
) -> None:
    """Wait for the middle of a sampling interval with nothing in flight, and for the
    test's subscriber to have what the broker acknowledged.

    QoS 1 is at-least-once: a broker killed while a PUBLISH is on the wire may
    have forwarded it yet reset the connection before its PUBACK is read, and the
    pusher must then send it again; one killed before the subscriber's PUBACK sends
    it to the subscriber again after its restart. Stopping the broker between two
    cycles, with both ends caught up, keeps those races (MQTT's, not the pusher's)
    out of this test.
    """
    while True:
        now = time.time_ns()
        await asyncio.sleep(((now // interval_ns + 1) * interval_ns + interval_ns // 2 - now) / 1e9)
        status = svc.publisher.status()
        if status["inflight_messages"] == 0 and status["buffered_readings"] == 0:
            received = sum(len(v) for v in col.readings.values())
            if received == svc.publisher.sent_readings:
                return


async def _outage(
    tmp_path: Path, outage_s: float, buffer_readings: int
) -> tuple[Collector, PusherService, dict[str, float]]:
    broker = PersistentMosquitto(tmp_path).start()
    col = Collector(broker.port, client_id="outage-collector", clean=False)
    await col.start()
    cfg = make_config(
        tmp_path,
        {
            "prefix": "/out",
            "qos": 1,
            "reconnect_max_s": 0.3,
            "buffer_readings": buffer_readings,
            "plugins": {"tester": {"sensors": 20, "interval": 100}},
        },
        broker_port=broker.port,
    )
    marks: dict[str, float] = {}
    try:
        async with running(cfg) as svc:
            await col.wait_for(lambda: len(col.readings.get("/out/tester/s0019", [])) >= 5)
            await _between_cycles(svc, col)
            # Stopped from this loop, the pusher's too: it sends nothing while mosquitto
            # exits, and the beats it may skip meanwhile on a loaded machine are counted.
            broker.stop()
            marks["down_ns"] = time.time_ns()
            await asyncio.sleep(outage_s)  # the outage itself: nothing to await
            assert not svc.publisher.connected
            await asyncio.to_thread(broker.start)  # the pusher samples on meanwhile
            marks["up_ns"] = time.time_ns()
            after = marks["up_ns"] + 1_000_000_000
            await col.wait_for(
                lambda: max(t for t, _ in col.readings["/out/tester/s0019"]) > after, 30
            )
        sent = svc.publisher.sent_readings
        await col.wait_for(lambda: sum(len(v) for v in col.readings.values()) >= sent, 15)
        return col, svc, marks
    finally:
        await col.stop()
        broker.stop()


async def test_broker_outage_of_10_s_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    col, svc, marks = await _outage(tmp_path, 10.0, buffer_readings=1_000_000)
    assert svc.publisher.dropped_readings == 0
    assert len(col.readings) == 20
    skipped = svc.metrics.skipped.labels("tester")._value.get()
    for sensor, points in col.readings.items():
        dupes = [t for t, n in Counter(t for t, _ in points).items() if n > 1]
        assert dupes == [], f"{sensor}: readings arrived twice"
        # A beat the sampler skipped (a loaded machine) is counted, not lost in the outage.
        gaps = grid_gaps(points, 100_000_000)
        assert gaps <= skipped, f"{sensor}: {gaps} gaps in the 100 ms grid, {skipped} skipped"
        ts = [t for t, _ in points]
        assert min(ts) < marks["down_ns"] and max(ts) > marks["up_ns"]
    received = sum(len(v) for v in col.readings.values())
    assert received == svc.publisher.sent_readings
    # What was sampled after the last wait is kept for the next start: nothing else is missing.
    path = svc.publisher.o.spool_path
    kept = sum(m.readings for m in spool_file.read(path)) if path and path.exists() else 0
    assert received + kept == svc.metrics.readings.labels("tester")._value.get()


async def test_outage_past_the_buffer_bound_drops_oldest_and_counts_them(tmp_path: Path) -> None:
    col, svc, marks = await _outage(tmp_path, 2.0, buffer_readings=200)
    dropped = svc.publisher.dropped_readings
    assert dropped > 0
    metrics = svc.metrics.service.render().decode()
    assert (
        f'kelvin_pusher_readings_dropped_total{{reason="buffer_full"}} {float(dropped)}' in metrics
    )
    produced = svc.metrics.readings.labels("tester")._value.get()
    received = sum(len(v) for v in col.readings.values())
    assert received + dropped == produced, "every reading is either delivered or counted"
    for sensor, points in col.readings.items():
        assert len({t for t, _ in points}) == len(points), f"{sensor}: duplicates"
        # The newest readings survive: the ones just before the restart arrived.
        ts = [t for t, _ in points]
        assert any(marks["up_ns"] - 1_000_000_000 < t < marks["up_ns"] for t in ts)


async def test_failover_uses_the_first_reachable_broker(tmp_path: Path) -> None:
    primary = Mosquitto(tmp_path, port=free_port())  # not started yet: down
    backup = Mosquitto(tmp_path).start()
    col_b = await Collector(backup.port).start()
    cfg = make_config(
        tmp_path,
        {
            "prefix": "/fo",
            "brokers": [f"127.0.0.1:{primary.port}", f"127.0.0.1:{backup.port}"],
            "reconnect_max_s": 0.3,
            "plugins": {"tester": {"sensors": 2, "interval": 100}},
        },
    )
    try:
        async with running(cfg) as svc:
            await col_b.wait_for(lambda: "/fo/tester/s0001" in col_b.readings)
            assert svc.publisher.status()["connected_to"] == f"127.0.0.1:{backup.port}"
            primary.start()
            col_a = await Collector(primary.port).start()
            backup.stop()  # the pusher reconnects, trying the primary first
            await col_a.wait_for(lambda: "/fo/tester/s0001" in col_a.readings)
            assert svc.publisher.status()["connected_to"] == f"127.0.0.1:{primary.port}"
            await col_a.stop()
    finally:
        await col_b.stop()
        backup.stop()
        primary.stop()


@pytest.mark.parametrize("fmt", ["kvb1", "dcdb"])
async def test_bursty_sending_batches_several_cycles_per_message(
    tmp_path: Path, mosquitto_broker: Mosquitto, collector: Collector, fmt: str
) -> None:
    cfg = make_config(
        tmp_path,
        {
            "prefix": "/bu",
            "format": fmt,
            "push": "bursty",
            "burst_interval_ms": 500,
            "qos": 0,
            "plugins": {"tester": {"sensors": 3, "interval": 50}},
        },
        broker_port=mosquitto_broker.port,
    )
    async with running(cfg):
        await collector.wait_for(lambda: len(collector.readings.get("/bu/tester/s0002", [])) >= 15)
    data_topics = [t for t in collector.topics if "/DCDB_MAP/" not in t]
    per_message = len(collector.readings["/bu/tester/s0002"]) / data_topics.count(
        "/bu/tester/s0002" if fmt == "dcdb" else "/KELVIN_BATCH//bu/tester"
    )
    assert per_message >= 4, "a burst carries several 50 ms cycles"


async def test_readings_unsent_at_stop_go_out_after_the_next_start(tmp_path: Path) -> None:
    port = free_port()  # no broker yet: everything stays buffered
    cfg = make_config(
        tmp_path,
        {
            "prefix": "/ks",
            "flush_timeout_s": 0,
            "plugins": {"tester": {"sensors": 3, "interval": 50}},
        },
        broker_port=port,
    )
    async with running(cfg) as svc:
        for _ in range(200):  # nothing to await: the buffer fills at the sampling rate
            if svc.publisher.buffered_readings >= 30:
                break
            await asyncio.sleep(0.05)
    assert svc.publisher.dropped_readings == 0
    spool = tmp_path / "state" / "unsent.bin"
    shutil.copy(spool, tmp_path / "copy.bin")
    kept = sum(m.readings for m in spool_file.load(tmp_path / "copy.bin"))
    stopped_ns = time.time_ns()
    broker = Mosquitto(tmp_path, port=port).start()
    col = await Collector(port).start()
    try:
        async with running(make_config(tmp_path, {"prefix": "/ks"}, broker_port=port)):
            await col.wait_for(lambda: sum(len(v) for v in col.readings.values()) >= kept)
        old = [(s, t) for s, pts in col.readings.items() for t, _ in pts if t < stopped_ns]
        assert len(old) == len(set(old)) == kept, "each kept reading arrives, once"
        assert not spool.exists()
    finally:
        await col.stop()
        broker.stop()
    assert kept >= 30
