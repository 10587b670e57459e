"""Waiting with a time limit and stopping tasks, so that every stop ends.

Python 3.11's ``asyncio.wait_for`` loses a cancellation that arrives while the
operation it waits for has just completed (python/cpython#86296, fixed in 3.12):
the cancelled task returns the result and goes on as if nothing happened, so a
loop being stopped (a sampling group, a timer, a reconnect loop) runs for ever and
``await task`` after ``task.cancel()`` never returns. Measured here (2 shared cores,
under load): the allocator's release timer, with the demo's job stream running, kept
running after 10 of 200 stops with ``asyncio.wait_for``, after none with
:func:`wait_event` (the test that stopped it then hung for ever). So Kelvin waits
with :func:`wait_for` / :func:`wait_event` (``asyncio.timeout`` underneath, which
counts cancellations), and ruff's banned-api rule keeps ``asyncio.wait_for`` out of
``services/``.

:func:`stop_task` is the other half: cancel a background task and wait for it a
bounded time, so that a task that swallows its cancellation anyway (a library
turning ``CancelledError`` into its own error and a retry loop catching that) is
logged with its stack and left behind instead of hanging the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

STOP_TASK_TIMEOUT_S = 5.0
"""How long :func:`stop_task` waits for a cancelled task by default."""


async def wait_for(aw: Awaitable[T], timeout_s: float | None) -> T:
    """``asyncio.wait_for`` that never loses a cancellation (raises ``TimeoutError``)."""
    async with asyncio.timeout(timeout_s):
        return await aw


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passed; whether it was set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    return event.is_set()


def cancelling() -> bool:
    """Whether the running task has a cancellation pending: a retry loop that catches a
    library's error checks this first, since aiomqtt's ``__aexit__`` (waiting for the
    broker while the task is cancelled) raises ``MqttError`` instead of the cancellation."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def stop_task(
    task: asyncio.Task[Any] | None, timeout_s: float = STOP_TASK_TIMEOUT_S, what: str = ""
) -> bool:
    """Cancel ``task`` and wait up to ``timeout_s`` for it to end; whether it ended.

    Half-way it is cancelled once more (a cancellation lost once by a library is not
    lost twice); a task still running at the end is logged with its stack and left
    behind. The caller's own cancellation is never swallowed, and the task's outcome
    (an exception included) is the caller's to inspect: ``task.exception()``.
    """
    if task is None or task.done():
        return True
    if not task.cancelling():  # cancelled already (with others): a second one would cut
        task.cancel()  # its clean-up short
    done, _ = await asyncio.wait({task}, timeout=timeout_s / 2)
    if not done:
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=timeout_s / 2)
    if not done:
        log.error(
            "%s did not end within %g s of being cancelled; left behind:\n%s",
            what or f"task {task.get_name()}",
            timeout_s,
            task_stack(task),
        )
        return False
    if not task.cancelled():
        task.exception()  # retrieved: the caller decides whether it matters
    return True


async def bounded(aw: Awaitable[Any], timeout_s: float, what: str) -> bool:
    """Run ``aw`` for at most ``timeout_s`` (then it is cancelled, and left behind if it
    will not end); whether it finished in time. Its exception is raised. Unlike
    :func:`wait_for` this bounds even code that swallows its cancellation."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done:
        task.result()
        return True
    log.warning("%s did not finish within %g s; cancelling it", what, timeout_s)
    await stop_task(task, STOP_TASK_TIMEOUT_S, what)
    return False


def task_stack(task: asyncio.Task[Any]) -> str:
    """Where ``task`` waits, as a traceback (the innermost ``await`` last)."""
    out = io.StringIO()
    task.print_stack(file=out)
    return out.getvalue().rstrip()


def pending_report(exclude: Iterable[asyncio.Task[Any]] = ()) -> str:
    """Every unfinished task of the running loop with its stack (for a stop that hangs)."""
    skip = {*exclude, asyncio.current_task()}
    tasks = sorted(
        (t for t in asyncio.all_tasks() if not t.done() and t not in skip),
        key=lambda t: t.get_name(),
    )
    return "\n".join(task_stack(t) for t in tasks) or "(no other task is pending)"
