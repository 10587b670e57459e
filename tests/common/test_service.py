"""The service runner: start order, reverse stop with flush, failure propagation."""

from __future__ import annotations

import asyncio

import pytest

from services.common.service import Service, run_services


class _Recorder(Service):
    def __init__(
        self,
        name: str,
        log: list[str],
        fail_start: bool = False,
        started: asyncio.Event | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.log = log
        self.fail_start = fail_start
        self.started = started

    async def start(self) -> None:
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.log.append(f"start {self.name}")
        if self.started:
            self.started.set()

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")


async def test_services_start_in_order_and_stop_in_reverse() -> None:
    log: list[str] = []
    stop = asyncio.Event()
    last = asyncio.Event()
    services = [_Recorder("a", log), _Recorder("b", log), _Recorder("c", log, started=last)]
    task = asyncio.create_task(run_services(services, stop))
    await last.wait()
    stop.set()
    await task
    assert log == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]


async def test_a_failed_start_stops_those_already_started() -> None:
    log: list[str] = []
    services = [_Recorder("a", log), _Recorder("b", log, fail_start=True), _Recorder("c", log)]
    with pytest.raises(RuntimeError, match="b cannot start"):
        await run_services(services, asyncio.Event())
    assert log == ["start a", "stop a"]


async def test_a_dying_background_task_stops_everything_with_its_error() -> None:
    log: list[str] = []
    last = asyncio.Event()
    a, b = _Recorder("a", log), _Recorder("b", log, started=last)

    async def crash() -> None:
        await asyncio.sleep(0)
        raise ValueError("disk on fire")

    task = asyncio.create_task(run_services([a, b], asyncio.Event()))
    await last.wait()
    b.watch(asyncio.create_task(crash()))
    with pytest.raises(ValueError, match="disk on fire"):
        await task
    assert log[-2:] == ["stop b", "stop a"]
