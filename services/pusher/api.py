"""The pusher's REST API (FastAPI, OpenAPI at ``/docs``): plugins, sensors, cache, control.

Read-only calls: list plugins and sensors, read the cache (latest value and
time-weighted average), publisher status. State-changing calls (start, stop,
load, unload, reload a plugin; reload the configuration file) require the
bearer token when one is configured; with ``auth_reads`` the reads do too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Query
from pydantic import BaseModel

from services.common import names
from services.common.errors import NotFoundError
from services.common.http import bearer, health_router, install_error_handlers

if TYPE_CHECKING:
    from services.pusher.app import PusherService


class PluginStatus(BaseModel):
    name: str
    plugin: str
    state: str
    error: str | None
    groups: int
    sensors: int
    notes: list[str] = []
    group_status: list[dict[str, Any]] | None = None


class CacheReading(BaseModel):
    sensor: str
    timestamp_ns: int | None
    value: float | None
    average: float | None = None
    average_s: float | None = None
    readings: list[tuple[int, float]] | None = None


class ReloadResult(BaseModel):
    loaded: list[str]
    unloaded: list[str]
    reloaded: list[str]
    restart_needed: list[str]


def create_app(svc: PusherService) -> FastAPI:
    app = FastAPI(
        title="Kelvin pusher",
        version="0.1.0",
        description="Sample node and facility sensors and publish them over MQTT.",
    )
    install_error_handlers(app)

    def token() -> str | None:
        return svc.settings.token

    def read_token() -> str | None:
        return svc.settings.token if svc.settings.auth_reads else None

    write = [Depends(bearer(token))]
    read = [Depends(bearer(read_token))]
    app.include_router(health_router(svc.metrics.service, svc.readiness))
    r = APIRouter(prefix="/api/v1")

    @r.get("/plugins", dependencies=read, summary="Loaded plugin instances")
    async def plugins() -> list[PluginStatus]:
        return [PluginStatus(**i.status()) for i in svc.manager.instances.values()]

    @r.get("/plugins/{name}", dependencies=read, summary="One plugin instance, with its groups")
    async def plugin(name: str) -> PluginStatus:
        return PluginStatus(**svc.manager.get(name).status(detail=True))

    @r.get("/plugin-types", dependencies=read, summary="Installed plugin types")
    async def plugin_types() -> dict[str, str]:
        from services.pusher.plugins import registry

        return {n: ep.value for n, ep in sorted(registry.available().items())}

    @r.get("/sensors", dependencies=read, summary="Sensor names (optionally of one plugin)")
    async def sensors(
        plugin: str | None = None, prefix: str | None = Query(None, examples=["/node17/procfs"])
    ) -> list[str]:
        insts = [svc.manager.get(plugin)] if plugin else list(svc.manager.instances.values())
        out = [n for i in insts for n in i.sensor_names]
        if prefix:
            p = names.validate_prefix(prefix)
            out = [n for n in out if names.is_under(n, p)]
        return sorted(out)

    @r.get("/cache/{sensor:path}", dependencies=read, summary="Cached readings of a sensor")
    async def cache(
        sensor: str,
        average_s: float | None = Query(
            None, gt=0, allow_inf_nan=False, description="time-weighted average window"
        ),
        readings: bool = Query(False, description="include the cached readings"),
    ) -> CacheReading:
        name = names.validate(sensor if sensor.startswith("/") else "/" + sensor)
        if name not in svc.cache:
            raise NotFoundError(f"sensor {name} is not in the cache of this pusher")
        latest = svc.cache.latest(name)
        out = CacheReading(
            sensor=name,
            timestamp_ns=latest.timestamp_ns if latest else None,
            value=latest.value if latest else None,
        )
        if average_s is not None:
            out.average = svc.cache.average(name, average_s)
            out.average_s = average_s
        if readings:
            ts, vs = svc.cache.readings(name)
            out.readings = list(zip(ts.tolist(), vs.tolist(), strict=True))
        return out

    @r.get("/status", dependencies=read, summary="Publisher and sampling status")
    async def status() -> dict[str, Any]:
        return {
            "prefix": svc.settings.node_prefix,
            "publisher": svc.publisher.status(),
            "plugins": {n: i.state for n, i in svc.manager.instances.items()},
        }

    @r.post("/plugins/{name}/start", dependencies=write, summary="Start sampling")
    async def start(name: str) -> PluginStatus:
        async with svc.manager.lock:
            return PluginStatus(**(await svc.manager.start(name)).status())

    @r.post("/plugins/{name}/stop", dependencies=write, summary="Stop sampling (stays loaded)")
    async def stop(name: str) -> PluginStatus:
        async with svc.manager.lock:
            return PluginStatus(**(await svc.manager.stop(name)).status())

    @r.post(
        "/plugins/{name}/load",
        dependencies=write,
        summary="Load a plugin instance from a section in the body, or from the config file",
    )
    async def load(
        name: str,
        section: Annotated[dict[str, Any] | None, Body(examples=[{"sensors": 10}])] = None,
    ) -> PluginStatus:
        async with svc.manager.lock:
            sec, origin = svc.section_for(name, section)
            return PluginStatus(**(await svc.manager.load(name, sec, origin)).status())

    @r.post("/plugins/{name}/unload", dependencies=write, summary="Stop and remove")
    async def unload(name: str) -> dict[str, str]:
        async with svc.manager.lock:
            await svc.manager.unload(name)
        return {"unloaded": name}

    @r.post(
        "/plugins/{name}/reload",
        dependencies=write,
        summary="Rebuild from the body's section, or from the configuration file as it is now",
    )
    async def reload(
        name: str, section: Annotated[dict[str, Any] | None, Body()] = None
    ) -> PluginStatus:
        async with svc.manager.lock:
            sec, origin = svc.section_for(name, section)
            return PluginStatus(**(await svc.manager.reload(name, sec, origin)).status())

    @r.post("/config/reload", dependencies=write, summary="Re-read the configuration file")
    async def reload_config() -> ReloadResult:
        async with svc.manager.lock:
            return ReloadResult(**await svc.reload_config())

    app.include_router(r)
    return app
