"""The service runner: start order, reverse stop with flush, failure propagation, bounded stops."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest

from services.common import service
from services.common.service import Service, StopTimeout, run_services


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


class _StuckStop(_Recorder):
    """A service whose stop never ends: it swallows every cancellation, until released."""

    stop_timeout_s = 0.2

    def __init__(self, name: str, log: list[str], started: asyncio.Event | None = None) -> None:
        super().__init__(name, log, started=started)
        self.release = False

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if self.release:
                    raise


async def test_a_stop_that_never_ends_is_left_behind_and_the_others_still_stop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(service, "STOP_GRACE_S", 0.2)
    log: list[str] = []
    stop = asyncio.Event()
    last = asyncio.Event()
    stuck = _StuckStop("b", log)
    services = [_Recorder("a", log), stuck, _Recorder("c", log, started=last)]
    task = asyncio.create_task(run_services(services, stop))
    await last.wait()
    stop.set()
    with caplog.at_level(logging.INFO, "services.common.service"):
        done, _ = await asyncio.wait({task}, timeout=20)
    assert done, "run_services did not return"
    with pytest.raises(StopTimeout, match="did not stop in time: b"):
        task.result()
    assert log[-3:] == ["stop c", "stop b", "stop a"]
    assert "b did not stop within 0.2 s" in caplog.text
    assert "in stop" in caplog.text and "asyncio.sleep(3600)" in caplog.text  # where it hangs
    assert "a stopped" in caplog.text
    stuck.release = True
    for t in asyncio.all_tasks():
        if t.get_name() == "stop:b":
            t.cancel()
            await asyncio.wait({t}, timeout=20)


_STUCK_PROCESS = """
import asyncio, sys, time
from services.common import service
from services.common.service import Service, run_services

service.STOP_GRACE_S = 0.1
service.EXIT_MARGIN_S = 0.5 if sys.argv[1] == "blocks" else 20.0  # which last resort acts

class Stuck(Service):
    name = "stuck"
    stop_timeout_s = 0.1
    async def start(self): pass
    async def stop(self):
        if sys.argv[1] == "blocks":
            time.sleep(60)  # the event loop itself no longer turns
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

async def main():
    stop = asyncio.Event()
    await run_services([Stuck()], stop, stop.set, exit_when_stuck=True)

asyncio.run(main())
print("returned")
"""


@pytest.mark.parametrize("how", ["swallows", "blocks"])
def test_the_kelvin_process_exits_1_instead_of_hanging(how: str) -> None:
    """A stop that swallows its cancellation: the runner exits at once after its grace; one
    that blocks the loop: the faulthandler deadline ends the process with every thread's stack."""
    proc = subprocess.run(
        [sys.executable, "-c", _STUCK_PROCESS, how], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    assert "returned" not in proc.stdout
    if how == "swallows":
        assert "exiting with status 1: stuck did not stop" in proc.stderr
    else:
        assert "Timeout (" in proc.stderr and "in stop" in proc.stderr  # faulthandler's dump
