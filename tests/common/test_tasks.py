"""Waits that never lose a cancellation, and task stops that always end."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.common import tasks

BOUND_S = 10.0
"""Generous: what is asserted is that the task ends at all, not how fast."""


async def _ended(task: asyncio.Task[object]) -> bool:
    done, _ = await asyncio.wait({task}, timeout=BOUND_S)
    return bool(done)


async def test_a_cancellation_that_lands_as_the_event_is_set_ends_the_loop() -> None:
    # Python 3.11's asyncio.wait_for returns the result here and the loop runs on.
    ev = asyncio.Event()
    waiting = asyncio.Event()

    async def loop() -> None:
        while True:
            waiting.set()
            await tasks.wait_event(ev, 30.0)
            ev.clear()

    task = asyncio.create_task(loop())
    await waiting.wait()
    ev.set()  # the wait completes in the next turn ...
    task.cancel()  # ... and the cancellation arrives in the same one
    assert await _ended(task) and task.cancelled()


async def test_wait_for_keeps_a_cancellation_that_lands_as_the_operation_completes() -> None:
    gate = asyncio.Event()
    started = asyncio.Event()
    rounds = 0

    async def op() -> int:
        started.set()
        await gate.wait()
        return 1

    async def loop() -> None:
        nonlocal rounds
        while True:
            rounds += await tasks.wait_for(op(), 30.0)
            gate.clear()

    task = asyncio.create_task(loop())
    await started.wait()
    gate.set()
    task.cancel()
    assert await _ended(task) and task.cancelled()
    assert rounds == 0


async def test_wait_event_and_wait_for_time_out() -> None:
    assert await tasks.wait_event(asyncio.Event(), 0.01) is False
    with pytest.raises(TimeoutError):
        await tasks.wait_for(asyncio.Event().wait(), 0.01)
    ev = asyncio.Event()
    ev.set()
    assert await tasks.wait_event(ev, 0.01) is True


class _Deaf:
    """A task body that swallows every cancellation (what a library's retry loop can do),
    until told to give up."""

    def __init__(self) -> None:
        self.give_up = False

    async def run(self) -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if self.give_up:
                    raise


async def test_stop_task_leaves_a_task_that_ignores_cancellation_behind_with_its_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deaf = _Deaf()
    task = asyncio.create_task(deaf.run(), name="deaf")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, "services.common.tasks"):
        assert await tasks.stop_task(task, 0.2, "the deaf task") is False
    assert "the deaf task did not end within 0.2 s" in caplog.text
    assert "in run" in caplog.text and "asyncio.sleep(3600)" in caplog.text  # where it waits
    deaf.give_up = True
    task.cancel()
    assert await _ended(task)


async def test_stop_task_stops_a_task_that_loses_one_cancellation() -> None:
    lost = asyncio.Event()

    async def loses_one() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            lost.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(loses_one())
    await asyncio.sleep(0)
    assert await tasks.stop_task(task, 2.0) is True  # cancelled again after 1 s
    assert lost.is_set() and task.cancelled()


async def test_bounded_cuts_off_a_close_that_never_ends() -> None:
    assert await tasks.bounded(asyncio.sleep(3600), 0.05, "a slow close") is False
    assert await tasks.bounded(asyncio.sleep(0), BOUND_S, "a quick close") is True
    with pytest.raises(ValueError, match="bad"):
        await tasks.bounded(_raise(), BOUND_S, "a failing close")


async def _raise() -> None:
    raise ValueError("bad")
