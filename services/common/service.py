"""The service contract and the runner behind ``kelvin run`` and ``kelvin up``.

A service binds its ports in :meth:`Service.start` (so a taken port fails
fast, before anything else starts), serves until :meth:`Service.stop`, and in
``stop`` flushes what it holds. A background task that dies unexpectedly
sets :attr:`Service.failed`, which stops the whole process with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


class Service(ABC):
    """One Kelvin service (pusher, collect agent, query API, allocator)."""

    name: str = "service"
    stop_timeout_s: float = 30.0
    """How long the runner lets :meth:`stop` take (a service that drains for a
    configured time raises it above that time)."""

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
    services: Sequence[Service], stop: asyncio.Event, on_started: Callable[[], None] | None = None
) -> None:
    """Start services in order (then call ``on_started``), run until ``stop`` is set or one
    fails, stop in reverse."""
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
        for svc in reversed(started):
            try:
                await asyncio.wait_for(svc.stop(), timeout=svc.stop_timeout_s)
                log.info("%s stopped", svc.name)
            except Exception:  # one service's bad stop must not keep the others from flushing
                log.exception("%s did not stop cleanly", svc.name)
    if failure is not None:
        raise failure


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
