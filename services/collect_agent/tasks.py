"""Stopping the agent's background tasks (commit loop, writer, subscriber, sweepers)."""

from __future__ import annotations

import asyncio
from typing import Any

from services.common.tasks import STOP_TASK_TIMEOUT_S, stop_task


async def cancel(task: asyncio.Task[Any] | None, timeout_s: float = STOP_TASK_TIMEOUT_S) -> None:
    """Cancel ``task`` (None is fine) and wait until it has finished unwinding, for at most
    ``timeout_s`` (then it is logged and left behind: the drain goes on). An error the
    task ended with before it was cancelled is raised."""
    if task is None:
        return
    ended = await stop_task(task, timeout_s, f"collect-agent task {task.get_name()}")
    if ended and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
