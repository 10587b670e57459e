"""The pusher's REST API: plugins, sensors, cache, control (OpenAPI at ``/openapi.json``).

Reads (plugins, sensors, the cache, publisher status) need the ``read`` role
when reads are protected; plugin control (start, stop, load, unload, reload a
plugin; reload the configuration file) needs ``admin``. ``/healthz``,
``/readyz`` and ``/metrics`` are public. :func:`route_table` lists every route
with its role, without a running pusher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.common import names
from services.common.auth import Role
from services.common.errors import NotFoundError
from services.pusher.http import Param, Request, Response, Router, json_response
from services.pusher.prom import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from services.pusher.app import PusherService

TITLE = "Kelvin pusher"
VERSION = "0.1.0"
DESCRIPTION = "Sample node and facility sensors and publish them over MQTT."

_PLUGIN_KEYS = ("name", "plugin", "state", "error", "groups", "sensors", "notes", "group_status")


def _plugin(status: dict[str, Any]) -> dict[str, Any]:
    """A plugin instance's status with every key of the API's answer, in its order."""
    out = {k: status.get(k) for k in _PLUGIN_KEYS}
    out["notes"] = out["notes"] or []
    return out


def create_router(svc: PusherService) -> Router:
    r = Router()
    read, admin = Role.READ, Role.ADMIN

    @r.add("GET", "/healthz", None, "Liveness")
    async def healthz(req: Request) -> Any:
        return {"status": "ok", "service": "pusher"}

    @r.add("GET", "/readyz", None, "Readiness (ready = connected to a broker)")
    async def readyz(req: Request) -> Any:
        ok, reason = svc.readiness()
        return json_response(
            {"status": "ready" if ok else "not ready", "reason": reason}, 200 if ok else 503
        )

    @r.add("GET", "/metrics", None, "Prometheus metrics")
    async def metrics(req: Request) -> Any:
        return Response(200, svc.metrics.service.render(), CONTENT_TYPE_LATEST)

    @r.add("GET", "/openapi.json", read, "This API's OpenAPI description")
    async def openapi(req: Request) -> Any:
        return r.openapi(TITLE, VERSION, DESCRIPTION)

    @r.add("GET", "/docs", read, "The routes, as a page")
    async def docs(req: Request) -> Any:
        rows = "".join(
            f"<tr><td>{m}</td><td><code>{p}</code></td><td>{role.value if role else 'public'}"
            f"</td><td>{route.summary}</td></tr>"
            for (m, p, role), route in zip(r.table(), r.routes, strict=True)
        )
        page = (
            f"<!doctype html><title>{TITLE}</title><h1>{TITLE}</h1><p>{DESCRIPTION} "
            f'Machine-readable: <a href="openapi.json">openapi.json</a>.</p>'
            f"<table><tr><th>method</th><th>path</th><th>role</th><th></th></tr>{rows}</table>"
        )
        return Response(200, page.encode(), "text/html; charset=utf-8")

    @r.add("GET", "/api/v1/plugins", read, "Loaded plugin instances")
    async def plugins(req: Request) -> Any:
        return [_plugin(i.status()) for i in svc.manager.instances.values()]

    @r.add("GET", "/api/v1/plugins/{name}", read, "One plugin instance, with its groups")
    async def plugin(req: Request) -> Any:
        return _plugin(svc.manager.get(req.path_params["name"]).status(detail=True))

    @r.add("GET", "/api/v1/plugin-types", read, "Installed plugin types")
    async def plugin_types(req: Request) -> Any:
        from services.pusher.plugins import registry

        return {n: v for n, v in sorted(registry.available_values().items())}

    @r.add(
        "GET",
        "/api/v1/sensors",
        read,
        "Sensor names (optionally of one plugin, or under a prefix)",
        [Param("plugin"), Param("prefix", example="/node17/procfs")],
    )
    async def sensors(req: Request) -> Any:
        plugin, prefix = req.params["plugin"], req.params["prefix"]
        insts = [svc.manager.get(plugin)] if plugin else list(svc.manager.instances.values())
        out = [n for i in insts for n in i.sensor_names]
        if prefix:
            p = names.validate_prefix(prefix)
            out = [n for n in out if names.is_under(n, p)]
        return sorted(out)

    @r.add(
        "GET",
        "/api/v1/cache/{sensor:path}",
        read,
        "Cached readings of a sensor",
        [
            Param("average_s", float, gt=0, description="time-weighted average window"),
            Param("readings", bool, False, description="include the cached readings"),
        ],
    )
    async def cache(req: Request) -> Any:
        sensor = req.path_params["sensor"]
        name = names.validate(sensor if sensor.startswith("/") else "/" + sensor)
        if name not in svc.cache:
            raise NotFoundError(f"sensor {name} is not in the cache of this pusher")
        latest = svc.cache.latest(name)
        out: dict[str, Any] = {
            "sensor": name,
            "timestamp_ns": latest.timestamp_ns if latest else None,
            "value": latest.value if latest else None,
            "average": None,
            "average_s": None,
            "readings": None,
        }
        average_s = req.params["average_s"]
        if average_s is not None:
            out["average"] = svc.cache.average(name, average_s)
            out["average_s"] = average_s
        if req.params["readings"]:
            ts, vs = svc.cache.readings(name)
            out["readings"] = [[t, v] for t, v in zip(ts, vs, strict=True)]
        return out

    @r.add("GET", "/api/v1/status", read, "Publisher and sampling status")
    async def status(req: Request) -> Any:
        return {
            "prefix": svc.settings.node_prefix,
            "publisher": svc.publisher.status(),
            "plugins": {n: i.state for n, i in svc.manager.instances.items()},
        }

    @r.add("POST", "/api/v1/plugins/{name}/start", admin, "Start sampling")
    async def start(req: Request) -> Any:
        async with svc.manager.lock:
            return _plugin((await svc.manager.start(req.path_params["name"])).status())

    @r.add("POST", "/api/v1/plugins/{name}/stop", admin, "Stop sampling (stays loaded)")
    async def stop(req: Request) -> Any:
        async with svc.manager.lock:
            return _plugin((await svc.manager.stop(req.path_params["name"])).status())

    @r.add(
        "POST",
        "/api/v1/plugins/{name}/load",
        admin,
        "Load a plugin instance from a section in the body, or from the configuration file",
        body='the plugin section, e.g. {"plugin": "tester", "sensors": 10}',
    )
    async def load(req: Request) -> Any:
        name = req.path_params["name"]
        async with svc.manager.lock:
            sec, origin = svc.section_for(name, _section(req))
            return _plugin((await svc.manager.load(name, sec, origin)).status())

    @r.add("POST", "/api/v1/plugins/{name}/unload", admin, "Stop and remove")
    async def unload(req: Request) -> Any:
        name = req.path_params["name"]
        async with svc.manager.lock:
            await svc.manager.unload(name)
        return {"unloaded": name}

    @r.add(
        "POST",
        "/api/v1/plugins/{name}/reload",
        admin,
        "Rebuild from the body's section, or from the configuration file as it is now",
        body="the plugin section (optional)",
    )
    async def reload(req: Request) -> Any:
        name = req.path_params["name"]
        async with svc.manager.lock:
            sec, origin = svc.section_for(name, _section(req))
            return _plugin((await svc.manager.reload(name, sec, origin)).status())

    @r.add("POST", "/api/v1/config/reload", admin, "Re-read the configuration file")
    async def reload_config(req: Request) -> Any:
        async with svc.manager.lock:
            return await svc.reload_config()

    return r


def _section(req: Request) -> dict[str, Any] | None:
    body = req.json()
    if body is not None and not isinstance(body, dict):
        from services.pusher.http import HttpError

        raise HttpError(
            422,
            [{"loc": ["body"], "msg": "Input should be a valid dictionary", "type": "dict_type"}],
        )
    return body


class _Offline:
    """Enough of a pusher for the route table (the handlers never run)."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("the route table's pusher does not run")


def route_table() -> list[tuple[str, str, Role | None]]:
    """(method, path template, role) of every route of the pusher's API.

    For the route-walking auth test: a route added to :func:`create_router` is in
    it automatically. Path parameters are ``{name}``; substitute any value.
    """
    return create_router(_Offline()).table()  # type: ignore[arg-type]
