"""The query API service: its one door (built from settings, owns its clients).

Routes: ``/api/v1/...`` (REST, OpenAPI at ``/docs``), ``/grafana/...`` (the
simpod JSON data source), ``/prometheus/api/v1/...`` (read-only Prometheus
HTTP API). The path ``/`` is left to the web console.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI

from services.common.auth_settings import ServiceAuth, service_auth
from services.common.errors import (
    KelvinError,
    RetryableStorageError,
    SensorNameError,
    TimeSpecError,
)
from services.common.http import HttpService, health_router, install_auth, install_error_handlers
from services.common.logs import RateLimitedLog
from services.common.metrics import ServiceMetrics
from services.common.net import Listener
from services.common.settings import Config
from services.common.storage import StorageBackend, create_storage
from services.common.storage.settings import StorageSettings
from services.common.tasks import stop_task, wait_for
from services.query_api import console
from services.query_api.context import READY, ApiContext
from services.query_api.limits import HeavyQueryGate
from services.query_api.routes import grafana, jobs, prometheus, readings, sensors, virtual
from services.query_api.settings import Settings
from services.query_api.virtual.define import VirtualIn, differs
from services.query_api.virtual.engine import Engine

log = logging.getLogger(__name__)
_bad_input_log = RateLimitedLog(log, 10.0)
DEFINE_PATIENCE_S = 60.0
"""Configured virtual sensors whose inputs are missing for longer than this are warned about."""


def _reason(exc: KelvinError) -> str:
    from services.query_api.query import QueryError
    from services.query_api.spec import SpecError
    from services.query_api.units import UnitError
    from services.query_api.virtual.define import DefinitionError
    from services.query_api.virtual.parser import ExpressionError, ExpressionTooDeep

    reasons: list[tuple[type[Exception], str]] = [
        (TimeSpecError, "bad_time"),
        (SensorNameError, "bad_sensor_name"),
        (SpecError, "bad_spec"),
        (UnitError, "bad_unit"),
        (QueryError, "bad_query"),
        (ExpressionTooDeep, "too_deep"),
        (ExpressionError, "bad_expression"),
        (DefinitionError, "bad_definition"),
    ]
    for cls, reason in reasons:
        if isinstance(exc, cls):
            return reason
    extra = getattr(exc, "reason", None)
    return str(extra) if extra else "bad_request"


def install_handlers(app: FastAPI, ctx: ApiContext) -> None:
    """Kelvin errors -> JSON ``{"error", "detail"}``; bad input is counted by reason."""
    install_error_handlers(app, ctx.metrics.rejects, _reason)


def create_app(
    settings: Settings,
    metrics: ServiceMetrics,
    ctx: ApiContext | None = None,
    auth: ServiceAuth | None = None,
) -> FastAPI:
    """The ASGI app; ``ctx`` carries the storage (attached later by the service).

    Without ``auth`` every route that needs a role refuses (nothing is open by accident).
    """
    ctx = ctx or ApiContext(settings, metrics)
    app = FastAPI(
        title="Kelvin query API",
        version="0.1.0",
        description="Sensor hierarchy, readings with DCDB operations and units, virtual sensors, "
        "Grafana JSON data source (/grafana) and a read-only Prometheus API (/prometheus).",
    )
    app.state.ctx = ctx
    app.add_middleware(
        HeavyQueryGate,
        max_heavy=settings.max_heavy_queries,
        wait_s=settings.heavy_query_wait_s,
        memory_bytes=settings.response_memory_bytes,
        refused=ctx.metrics.refused,
        spilled=ctx.metrics.spilled,
    )
    if auth is not None:
        install_auth(app, auth, metrics)
    install_handlers(app, ctx)

    def ready() -> tuple[bool, str]:
        return ctx.readiness

    app.include_router(health_router(metrics, ready))
    app.include_router(sensors.router(ctx))
    app.include_router(readings.router(ctx))
    app.include_router(virtual.router(ctx))
    app.include_router(prometheus.router(ctx))
    app.include_router(grafana.router(ctx))
    app.include_router(jobs.router(ctx))
    console.mount(app)
    return app


DEMO_VIRTUAL_SENSORS = {
    "/hall/pue": {
        "expression": '("/hall/power" + "/hall/cooling_power") / "/hall/power"',
        "description": "Power usage effectiveness of the simulated hall",
    }
}
"""Defined at start under ``kelvin up --demo`` (the Kelvin — PUE dashboard charts it)."""


class QueryApiService(HttpService):
    """Opens storage before serving; closes it after the HTTP server stopped."""

    def __init__(
        self,
        settings: Settings,
        storage_settings: StorageSettings,
        profile: str = "run",
        auth: ServiceAuth | None = None,
    ) -> None:
        self.settings = settings
        self.profile = profile
        self.auth = auth
        self.wanted_virtual = dict(settings.virtual_sensors)
        if profile == "demo":
            self.wanted_virtual = {**DEMO_VIRTUAL_SENSORS, **self.wanted_virtual}
        self.definer: asyncio.Task[None] | None = None
        """Defines ``virtual_sensors`` (and the demo's); done once all of them exist."""
        self.storage_settings = storage_settings
        self.metrics = ServiceMetrics("query_api")
        self.ctx = ApiContext(settings, self.metrics, auth=auth)
        self.ctx.configured_virtual = set(self.wanted_virtual)
        self.ctx.profile = profile
        super().__init__(
            "query-api",
            create_app(settings, self.metrics, self.ctx, auth),
            settings.host,
            settings.port,
            "--query-api-port",
            metrics=self.metrics,
        )
        self.storage: StorageBackend | None = None
        self.watcher: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self.storage = create_storage(self.storage_settings)
        try:
            await self.storage.open()
        except (RetryableStorageError, OSError) as exc:
            # Storage down at start is no reason to exit (a crash loop): serve, answer
            # 503, report not ready, and keep trying in the background.
            log.warning("storage not reachable at start (%s); serving, not ready", exc)
            self.ctx.readiness = (False, f"storage not reachable: {exc}")
        else:
            self._attached()
        self.watcher = asyncio.create_task(self._watch_storage(), name="storage-watch")
        self._start_rules()  # rules on Kelvin's own metrics work while storage is down

    def _attached(self) -> None:
        assert self.storage is not None
        self.ctx.attach(self.storage)
        self.metrics.up.set(1)
        if self.wanted_virtual:
            self.definer = asyncio.create_task(self._define_configured(), name="virtual-definer")

    async def _watch_storage(self) -> None:
        """Open storage if it was down at start, then ping it: ``/readyz`` follows."""
        assert self.storage is not None
        storage, every = self.storage, self.settings.storage_check_s
        delay = min(0.1, every)
        while self.ctx._storage is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, every)
            try:
                await storage.open()
            except (RetryableStorageError, OSError) as exc:
                self.ctx.readiness = (False, f"storage not reachable: {exc}")
                continue
            log.info("storage reachable: open")
            self._attached()
        while True:
            await asyncio.sleep(every)
            try:
                ok = await wait_for(storage.ping(), max(every, 1.0))
            except Exception:  # a hung or failing ping: storage is not reachable
                ok = False
            if ok != self.ctx.readiness[0]:
                log.log(
                    logging.INFO if ok else logging.WARNING,
                    "storage %s",
                    "answers again: ready" if ok else "does not answer its ping: not ready",
                )
            self.ctx.readiness = READY if ok else (False, "storage does not answer its ping")

    async def _define_configured(self) -> None:
        """Define configured virtual sensors, retrying those whose inputs do not exist yet."""
        pending = dict(self.wanted_virtual)
        started = time.monotonic()
        delay = min(0.5, self.settings.virtual_retry_s)
        while pending:
            engine = self.ctx.virtual
            assert isinstance(engine, Engine)
            for name, body in list(pending.items()):
                try:
                    spec = VirtualIn(**body)
                    old = await self.ctx.catalog.virtual(name)
                    if old is None or differs(old, spec):
                        await engine.put(name, spec)
                        log.info("virtual sensor %s defined from the configuration", name)
                    del pending[name]
                except (KelvinError, ValueError) as exc:
                    # At start the inputs are usually still on their way (the pusher's first
                    # readings): say so quietly, and warn only when it lasts.
                    waited = time.monotonic() - started
                    msg = "virtual sensor %s not defined yet (%.0f s): %s"
                    if waited < DEFINE_PATIENCE_S:
                        log.info(msg, name, waited, exc)
                    else:
                        _bad_input_log.warning("virtual_sensors", msg, name, waited, exc)
            if pending:
                # Soon at first (the inputs usually arrive within a second of the start),
                # then every virtual_retry_s.
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.virtual_retry_s)

    def _start_rules(self) -> None:
        s = self.settings
        builtin = s.builtin_rules if s.builtin_rules is not None else self.profile == "demo"
        if s.rule_files or builtin:
            from services.query_api.rules.manager import RuleManager

            self.ctx.rules = RuleManager(self.ctx, list(s.rule_files), builtin)
            self.ctx.rules.start()

    async def close(self) -> None:
        if self.ctx.rules is not None:
            await self.ctx.rules.stop()
            self.ctx.rules = None
        await stop_task(self.watcher, what="query API storage watcher")
        self.watcher = None
        await stop_task(self.definer, what="query API virtual-sensor definer")
        self.definer = None
        self.metrics.up.set(0)
        await self.ctx.aclose()
        if self.storage is not None:
            await self.storage.close()
            self.storage = None


def create_service(config: Config) -> QueryApiService:
    settings = config.load(Settings)
    auth = service_auth(config, settings.host, "query API")
    return QueryApiService(settings, config.load(StorageSettings), config.profile, auth)


def listeners(config: Config) -> list[Listener]:
    """The ports ``kelvin run``/``up`` checks before anything starts."""
    s = config.load(Settings)
    return [Listener(s.host, s.port, "query-api HTTP", "--query-api-port")]
