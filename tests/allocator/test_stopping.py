"""The allocator stops, whatever its broker does and whenever the stop lands.

The broker is a real socket server on loopback that misbehaves on purpose
(:mod:`tests.support.misbehaving_broker`): it never answers CONNECT, or it stops
reading in the middle of a large PUBLISH (the client's socket fills, its
DISCONNECT can never go out, and aiomqtt's ``__aexit__`` turns the cancellation
into an ``MqttError``, which the reconnect loop used to take for a lost broker).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.allocator.app import create_service
from services.allocator.metrics import AllocatorMetrics
from services.allocator.publisher import DecisionPublisher
from tests.allocator.test_service import _config
from tests.support.misbehaving_broker import MisbehavingBroker
from tests.support.servers import free_port

BOUND_S = 20.0
"""Generous: what is asserted is that the stop ends at all."""
BIG = 1 << 20


@pytest.fixture
async def publisher() -> AsyncIterator[DecisionPublisher]:
    yield DecisionPublisher(["unset"], "/kelvin/allocator", AllocatorMetrics(), timeout_s=0.5)


async def _stop_within_bound(pub: DecisionPublisher, task: asyncio.Task[None]) -> None:
    stopping = asyncio.create_task(pub.stop(flush_timeout_s=0.0))
    done, _ = await asyncio.wait({stopping}, timeout=BOUND_S)
    assert done, "the publisher's stop did not end"
    stopping.result()
    assert task.done(), "the publisher's task was left behind instead of ending"


async def test_stopped_while_its_broker_never_answers_connect(
    publisher: DecisionPublisher,
) -> None:
    async with MisbehavingBroker("silent") as broker:
        publisher.brokers = [("127.0.0.1", broker.port)]
        task = publisher.start()
        await asyncio.sleep(0.1)  # inside the connect (the CONNACK wait is 0.5 s)
        await _stop_within_bound(publisher, task)
        assert not publisher.connected


async def test_stopped_while_a_large_publish_is_stuck_in_a_full_socket(
    publisher: DecisionPublisher,
) -> None:
    async with MisbehavingBroker("stalls", BIG) as broker:
        publisher.brokers = [("127.0.0.1", broker.port)]
        task = publisher.start()
        await broker.connected.wait()
        # One job record of 32 MB: more than both sockets' buffers on loopback hold.
        publisher.offer_job("big", 1, 2, ["n" * 1000] * (32 * BIG // 1000))
        await broker.stalled.wait()
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
