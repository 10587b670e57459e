"""The service contract and the runner behind ``kelvin run`` and ``kelvin up``.

A service binds its ports in :meth:`Service.start` (so a taken port fails
fast, before anything else starts), serves until :meth:`Service.stop`, and in
``stop`` flushes what it holds. A background task that dies unexpectedly
sets :attr:`Service.failed`, which stops the whole process with an error.

Stopping is bounded: a service's stop that outlives its ``stop_timeout_s`` is
reported with every pending task's stack and left behind, and the ``kelvin``
process then exits with status 1 rather than hang (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from services.common.errors import KelvinError
from services.common.tasks import pending_report, task_stack

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
"""A stop that outlived its ``stop_timeout_s`` is cancelled and has this long to unwind."""
EXIT_MARGIN_S = 15.0
"""After the last stop: closing the loop, the executors' threads, the interpreter."""


class Service(ABC):
    """One Kelvin service (pusher, collect agent, query API, allocator)."""

    name: str = "service"
    stop_timeout_s: float = 20.0
    """How long the runner lets :meth:`stop` take (a service that drains for a
    configured time raises it above that time). Within Kubernetes' default 30 s
    grace period, so that a stuck stop is reported before the kubelet kills the pod."""

    def __init__(self) -> None:
        self._failed: asyncio.Future[None] | None = None

    @property
    def failed(self) -> asyncio.Future[None]:
        """Resolves with an exception when the service can no longer serve."""
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        return self._failed

    def fail(self, exc: BaseException) -> None:
        if not self.failed.done():
            self.failed.set_exception(exc)

    def watch(self, task: asyncio.Task[object]) -> asyncio.Task[object]:
        """Fail the service if ``task`` ends with an exception other than cancellation."""

        def _done(t: asyncio.Task[object]) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error(
                    "%s: background task %s died", self.name, t.get_name(), exc_info=t.exception()
                )
                self.fail(t.exception())  # type: ignore[arg-type]

        task.add_done_callback(_done)
        return task

    @abstractmethod
    async def start(self) -> None:
        """Bind ports and start serving; raise PortInUseError / ConfigError early."""

    @abstractmethod
    async def stop(self) -> None:
        """Flush what the service holds and release everything. Idempotent."""


async def run_services(
    services: Sequence[Service],
    stop: asyncio.Event,
    on_started: Callable[[], None] | None = None,
    exit_when_stuck: bool = False,
) -> None:
    """Start services in order (then call ``on_started``), run until ``stop`` is set or one
    fails, stop in reverse.

    Each stop gets its service's ``stop_timeout_s``; a stop still running then is logged
    with every pending task's stack, cancelled, given :data:`STOP_GRACE_S` more and else
    left behind, and the next service is stopped all the same. A stop left behind raises
    :class:`StopTimeout` at the end, or, with ``exit_when_stuck`` (the ``kelvin``
    process), ends the process with status 1 at once: what was left behind would hang
    ``asyncio.run``'s own clean-up. ``exit_when_stuck`` also arms a last resort that
    needs no event loop (:func:`arm_exit_deadline`), for a loop that no longer turns or
    a thread that never ends.
    """
    started: list[Service] = []
    failure: BaseException | None = None
    try:
        for svc in services:
            await svc.start()
            started.append(svc)
            log.info("%s started", svc.name)
        if on_started is not None:
            on_started()
        stop_wait = asyncio.ensure_future(stop.wait())
        waits = [stop_wait, *(asyncio.ensure_future(_wait_failed(s)) for s in started)]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        for d in done:
            if d is not stop_wait and d.exception() is not None:
                failure = d.exception()
    finally:
        if exit_when_stuck and started:
            arm_exit_deadline(stop_budget_s(started))
        stuck = [svc.name for svc in reversed(started) if not await _stop_one(svc)]
        if stuck and exit_when_stuck:
            _exit_now(stuck)
    if failure is not None:
        raise failure
    if stuck:
        raise StopTimeout(stuck)


class StopTimeout(KelvinError):
    """A service's stop did not end within its ``stop_timeout_s`` (and was left behind)."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(f"did not stop in time: {', '.join(names)} (see the log for where)")
        self.names = list(names)


def stop_budget_s(services: Sequence[Service]) -> float:
    """The longest stopping ``services`` may take: every stop's time and grace, plus a margin
    for what comes after (closing the loop, joining threads)."""
    return sum(s.stop_timeout_s + STOP_GRACE_S for s in services) + EXIT_MARGIN_S


async def _stop_one(svc: Service) -> bool:
    """Stop ``svc`` within its time; whether its stop ended (cleanly or with an error)."""
    task = asyncio.create_task(svc.stop(), name=f"stop:{svc.name}")
    done, _ = await asyncio.wait({task}, timeout=svc.stop_timeout_s)
    if not done:
        log.error(
            "%s did not stop within %g s (stop_timeout_s); cancelling its stop. Pending:\n%s",
            svc.name,
            svc.stop_timeout_s,
            pending_report(),
        )
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STOP_GRACE_S)
        if not done:
            log.error(
                "%s: its stop did not end %g s after being cancelled either; left behind:\n%s",
                svc.name,
                STOP_GRACE_S,
                task_stack(task),
            )
            return False
    if task.cancelled():
        log.error("%s: its stop was cut short (cancelled)", svc.name)
    elif task.exception() is not None:
        # one service's bad stop must not keep the others from flushing
        log.error("%s did not stop cleanly", svc.name, exc_info=task.exception())
    else:
        log.info("%s stopped", svc.name)
    return True


def arm_exit_deadline(seconds: float) -> None:
    """In ``seconds``, print every thread's stack to stderr and end the process with
    status 1, whatever the event loop and the other threads are doing (a C thread of
    :mod:`faulthandler`: it needs neither the loop nor, to fire, the GIL). For the
    ``kelvin`` process only: it replaces any earlier such timer of this process."""
    log.info("stopping: this process exits with status 1 unless stopped within %.0f s", seconds)
    faulthandler.dump_traceback_later(seconds, exit=True)


def _exit_now(stuck: Sequence[str]) -> None:
    log.critical(
        "exiting with status 1: %s did not stop within stop_timeout_s (stacks above)",
        ", ".join(stuck),
    )
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(1)


async def _wait_failed(svc: Service) -> None:
    await svc.failed


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set ``stop``; a second SIGINT aborts."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, _on_signal, stop, sig)


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    if stop.is_set() and sig == signal.SIGINT:
        raise KeyboardInterrupt
    log.info("received %s, flushing and stopping", signal.Signals(sig).name)
    stop.set()
