"""The allocator service: its one door (built from settings, owns its clients and tasks)."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI

from services.allocator import api_cluster
from services.allocator.api import install_validation_counter, router
from services.allocator.demo import run_job_stream
from services.allocator.metrics import AllocatorMetrics
from services.allocator.runtime import AllocatorCore
from services.allocator.settings import Settings
from services.common.auth_settings import ServiceAuth, service_auth
from services.common.errors import ConfigError
from services.common.http import HttpService, health_router, install_auth, install_error_handlers
from services.common.net import Listener
from services.common.settings import Config
from services.common.tasks import stop_task


def create_app(core: AllocatorCore, auth: ServiceAuth | None = None) -> FastAPI:
    """The allocator's ASGI app; without ``auth`` every route that needs a role refuses."""
    app = FastAPI(
        title="Kelvin allocator",
        version="0.1.0",
        description="Thermal- and communication-aware job placement (MPIT, MC1x1, joint).",
    )
    if auth is not None:
        install_auth(app, auth, core.metrics)
    install_error_handlers(app)
    install_validation_counter(app, core)
    app.include_router(health_router(core.metrics))
    app.include_router(router(core))
    app.include_router(api_cluster.router(core))
    return app


class AllocatorService(HttpService):
    """HTTP API + release timer + periodic publishing + MQTT publisher (+ job stream)."""

    def __init__(
        self,
        settings: Settings,
        core: AllocatorCore,
        job_stream: bool,
        auth: ServiceAuth | None = None,
    ) -> None:
        super().__init__(
            "allocator",
            create_app(core, auth),
            settings.host,
            settings.port,
            "--allocator-port",
            metrics=core.metrics,
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
        others = [t for t in self._tasks if t.get_name() != "allocator-publisher"]
        for task in others:
            task.cancel()
        for task in others:
            await stop_task(task, what=f"allocator task {task.get_name()}")
        self._tasks = []
        self.core.commit()  # the state is on disk before anything else may take long
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
    auth = service_auth(config, settings.host, "allocator")
    return AllocatorService(settings, core, job_stream, auth)


def listeners(config: Config) -> list[Listener]:
    """The ports ``kelvin run``/``up`` checks before anything starts."""
    s = config.load(Settings)
    return [Listener(s.host, s.port, "allocator HTTP", "--allocator-port")]
