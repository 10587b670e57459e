"""The allocator stops, whatever its broker does and whenever the stop lands.

The broker is a real mosquitto, frozen (SIGSTOP) to fail the way a hung broker does:
before the publisher connects (the kernel completes the TCP handshake, CONNECT is never
answered), or once it is connected and a large PUBLISH fills both sockets' buffers (the
client's DISCONNECT can never go out, and aiomqtt's ``__aexit__`` turns the
cancellation into an ``MqttError``, which the reconnect loop used to take for a lost
broker and reconnect for ever).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from services.allocator.app import create_service
from services.allocator.metrics import AllocatorMetrics
from services.allocator.publisher import DecisionPublisher
from tests.allocator.test_service import _config
from tests.support.servers import Mosquitto, free_port

BOUND_S = 20.0
"""Generous: what is asserted is that the stop ends at all."""
BIG = 1 << 20


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path).start()
    try:
        yield mosquitto
    finally:
        if mosquitto.proc is not None:
            mosquitto.proc.send_signal(signal.SIGCONT)
        mosquitto.stop()


def _freeze(broker: Mosquitto) -> None:
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGSTOP)


def _unread(port: int) -> int:
    """Bytes waiting in the receive queues of the established connections to ``port``
    (what the broker has not read), from /proc/net/tcp."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
            total += int(fields[4].split(":")[1], 16)
    return total


async def _until(what: str, check: Callable[[], bool], within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {within_s} s"
        await asyncio.sleep(0.01)


@pytest.fixture
async def publisher(broker: Mosquitto) -> AsyncIterator[DecisionPublisher]:
    yield DecisionPublisher(
        [f"127.0.0.1:{broker.port}"], "/kelvin/allocator", AllocatorMetrics(), timeout_s=2.0
    )


async def _stop_within_bound(pub: DecisionPublisher, task: asyncio.Task[None]) -> None:
    stopping = asyncio.create_task(pub.stop(flush_timeout_s=0.0))
    done, _ = await asyncio.wait({stopping}, timeout=BOUND_S)
    assert done, "the publisher's stop did not end"
    stopping.result()
    assert task.done(), "the publisher's task was left behind instead of ending"


async def test_stopped_while_its_broker_never_answers_connect(
    publisher: DecisionPublisher, broker: Mosquitto
) -> None:
    _freeze(broker)
    task = publisher.start()
    await _until("CONNECT sent, unread", lambda: _unread(broker.port) > 0)
    await _stop_within_bound(publisher, task)
    assert not publisher.connected


async def test_stopped_while_a_large_publish_is_stuck_in_a_full_socket(
    publisher: DecisionPublisher, broker: Mosquitto
) -> None:
    task = publisher.start()
    await _until("connected", lambda: publisher.connected)
    _freeze(broker)
    # One job record of 32 MB: more than both sockets' buffers on loopback hold.
    publisher.offer_job("big", 1, 2, ["n" * 1000] * (32 * BIG // 1000))
    # The broker's receive queue stays at its initial size (128 KiB here) when it reads nothing.
    await _until("the broker's socket full", lambda: _unread(broker.port) > 64 << 10)
    assert publisher.connected and publisher.buffer, "still publishing"
    await _stop_within_bound(publisher, task)


async def test_the_release_timer_stops_when_a_job_change_lands_with_the_cancellation(
    tmp_path: Path,
) -> None:
    svc = create_service(_config(tmp_path / "s", free_port()))
    core = svc.core
    core.load()
    core.submit(2, 3600.0, 0.0)  # a running job: the timer waits with a time limit
    timer = asyncio.create_task(core.run_timer())
    for _ in range(3):
        await asyncio.sleep(0)
    core.changed.set()  # a submit or an end, as the stop begins ...
    timer.cancel()  # ... lost by Python 3.11's asyncio.wait_for, and the loop ran on
    done, _ = await asyncio.wait({timer}, timeout=BOUND_S)
    assert done and timer.cancelled()
