"""The allocator service: its one door (built from settings, owns its clients and tasks)."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI

from services.allocator import api_cluster
from services.allocator.api import install_validation_counter, router
from services.allocator.demo import run_job_stream
from services.allocator.metrics import AllocatorMetrics
from services.allocator.runtime import AllocatorCore
from services.allocator.settings import Settings
from services.common.auth import Credentials, Role
from services.common.errors import ConfigError
from services.common.http import HttpService, health_router, install_error_handlers
from services.common.settings import Config


def create_app(core: AllocatorCore) -> FastAPI:
    app = FastAPI(
        title="Kelvin allocator",
        version="0.1.0",
        description="Thermal- and communication-aware job placement (MPIT, MC1x1, joint).",
    )
    install_error_handlers(app)
    install_validation_counter(app, core)
    app.state.credentials = lambda: _credentials(core.settings.api_token)
    app.include_router(health_router(core.metrics))
    app.include_router(router(core))
    app.include_router(api_cluster.router(core))
    return app


def _credentials(api_token: str | None) -> Credentials:
    """The roles of the routes declared with ``requires``: ``api_token`` is the admin credential
    (reads open); without one every role is open, as the other routes are (development)."""
    if not api_token:
        return Credentials(open_roles=frozenset(Role))
    return Credentials.from_roles({Role.ADMIN: [api_token]}, open_roles=[Role.READ])


class AllocatorService(HttpService):
    """HTTP API + release timer + periodic publishing + MQTT publisher (+ job stream)."""

    def __init__(self, settings: Settings, core: AllocatorCore, job_stream: bool) -> None:
        super().__init__(
            "allocator", create_app(core), settings.host, settings.port, "--allocator-port"
        )
        self.settings = settings
        self.core = core
        self.job_stream = job_stream
        self._tasks: list[asyncio.Task[object]] = []

    async def open(self) -> None:
        self.core.load()
        self._tasks = [
            self.watch(asyncio.create_task(self.core.run_timer(), name="allocator-timer")),
            self.watch(asyncio.create_task(self.core.run_periodic(), name="allocator-publish")),
            self.watch(self.core.publisher.start()),
        ]
        if self.job_stream:
            stream = run_job_stream(self.core, self.settings.job_stream, self.settings.demo_seed)
            self._tasks.append(self.watch(asyncio.create_task(stream, name="allocator-jobs")))
        self.core.metrics.up.set(1)

    async def close(self) -> None:
        self.core.metrics.up.set(0)
        for task in self._tasks:
            if task.get_name() != "allocator-publisher":
                task.cancel()
        for task in self._tasks:
            if task.get_name() != "allocator-publisher":
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._tasks = []
        self.core.commit()
        await self.core.publisher.stop()


def create_service(config: Config) -> AllocatorService:
    settings = config.load(Settings)
    metrics = AllocatorMetrics()
    core = AllocatorCore(settings, metrics)
    enabled = settings.job_stream.enabled
    job_stream = config.profile == "demo" if enabled is None else enabled
    if settings.cluster == "external":
        if enabled:
            raise ConfigError(
                "allocator.job_stream.enabled: the demo's job stream needs allocator.cluster: "
                "internal (with external, jobs come from the workload manager)"
            )
        job_stream = False
    return AllocatorService(settings, core, job_stream)
