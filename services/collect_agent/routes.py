"""HTTP API of the collect agent: InfluxDB-compatible ``/write`` and ``/ping``, REST, stats.

Every route declares its role: ``/write`` needs ``write`` (the credential taken
the ways Telegraf sends it: ``Authorization: Bearer|Token``, HTTP Basic password,
``p=`` query parameter); kicking a client and forgetting a cached sensor need
``admin``; the rest reads (``read``); ``/ping`` is public.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse

from services.collect_agent import http_ingest, line_protocol, remote_write
from services.common import names
from services.common.auth import Role
from services.common.errors import NotFoundError, SensorNameError, TimeSpecError
from services.common.http import public, requires
from services.common.times import parse_duration_ns

if TYPE_CHECKING:
    from services.collect_agent.app import CollectAgent

INFLUX_VERSION = "1.8.10-kelvin"


def create_router(agent: CollectAgent) -> APIRouter:
    router = APIRouter()
    s = agent.settings
    lines = line_protocol.LineProtocol(s.influx_measurements, s.influx_prefix)
    needs_read, needs_write = requires(Role.READ), requires(Role.WRITE)
    needs_admin = requires(Role.ADMIN)

    # ------------------------------------------------------------------ InfluxDB compatible
    @router.api_route(
        "/ping", methods=["GET", "HEAD"], tags=["influx"], status_code=204, dependencies=[public()]
    )
    async def ping(verbose: bool = False) -> Response:
        headers = {"X-Influxdb-Version": INFLUX_VERSION, "X-Influxdb-Build": "OSS"}
        if verbose:
            return JSONResponse({"version": INFLUX_VERSION}, headers=headers)
        return Response(status_code=204, headers=headers)

    async def write(request: Request, precision: str) -> Response:
        def decode(body: bytes) -> http_ingest.Decoded:
            if not body.isascii():
                try:
                    body.decode("utf-8")
                except UnicodeDecodeError:
                    raise http_ingest.BodyError("body is not UTF-8", "bad_utf8") from None
            try:
                res = lines.parse(body, precision, time.time_ns())
            except line_protocol.LineProtocolError as exc:
                raise http_ingest.BodyError(str(exc), exc.reason) from None
            return http_ingest.Decoded(res.batch, res.lines, res.errors, "line")

        return await http_ingest.ingest(
            agent.ingestor, request, s.max_payload_bytes, decode, "http"
        )

    @router.post("/write", tags=["influx"], status_code=204, dependencies=[needs_write])
    async def write_v1(request: Request, precision: str = "ns") -> Response:
        """InfluxDB 1.x write: line protocol body, ``precision`` n|u|ms|s|m|h; 204 once durable."""
        return await write(request, precision)

    @router.post("/api/v2/write", tags=["influx"], status_code=204, dependencies=[needs_write])
    async def write_v2(request: Request, precision: str = "ns") -> Response:
        """InfluxDB 2.x write (Telegraf ``outputs.influxdb_v2``); bucket and org are ignored."""
        return await write(request, precision)

    # ------------------------------------------------------------------ REST
    @router.get("/api/v1/sensors", tags=["cache"], dependencies=[needs_read])
    async def sensors(prefix: str = "/") -> dict[str, Any]:
        """Sensors in the cache under ``prefix`` with their latest reading."""
        cache = agent.require_cache()
        try:
            p = names.validate_prefix(prefix)
        except SensorNameError as exc:
            raise HTTPException(400, str(exc)) from exc
        out = []
        for name in cache.sensors():
            if names.is_under(name, p):
                v = cache.latest(name)
                if v is not None:
                    out.append({"name": name, "timestamp_ns": v.timestamp_ns, "value": v.value})
        return {"prefix": p, "count": len(out), "sensors": out}

    @router.get("/api/v1/latest", tags=["cache"], dependencies=[needs_read])
    async def latest(sensor: str = Query(..., description="sensor name")) -> dict[str, Any]:
        v = agent.require_cache().latest(sensor)
        if v is None:
            raise NotFoundError(f"sensor {sensor!r} has no cached reading on this agent")
        return {"sensor": sensor, "timestamp_ns": v.timestamp_ns, "value": v.value}

    @router.get("/api/v1/average", tags=["cache"], dependencies=[needs_read])
    async def average(
        sensor: str = Query(...), interval: str = Query("60s", description="e.g. 30s, 5m")
    ) -> dict[str, Any]:
        """Time-weighted average over the last ``interval`` (up to the newest reading)."""
        try:
            window_ns = parse_duration_ns(interval)
        except TimeSpecError as exc:
            raise HTTPException(400, str(exc)) from exc
        value = agent.require_cache().average(sensor, window_ns / 1e9)
        if value is None:
            raise NotFoundError(f"sensor {sensor!r} has no cached reading on this agent")
        return {"sensor": sensor, "interval_s": window_ns / 1e9, "value": value}

    @router.delete("/api/v1/cache", tags=["cache"], status_code=204, dependencies=[needs_admin])
    async def forget(sensor: str = Query(...)) -> Response:
        agent.require_cache().forget(sensor)
        return Response(status_code=204)

    @router.get("/api/v1/hosts", tags=["hosts"], dependencies=[needs_read])
    async def hosts() -> dict[str, Any]:
        """Connected MQTT clients (built-in endpoint) and the broker subscription."""
        clients = agent.mqtt.clients() if agent.mqtt is not None else []
        broker = agent.subscriber.info() if agent.subscriber is not None else None
        return {"count": len(clients), "hosts": clients, "broker": broker}

    @router.delete(
        "/api/v1/hosts/{client_id}", tags=["hosts"], status_code=204, dependencies=[needs_admin]
    )
    async def kick(client_id: str) -> Response:
        """Disconnect a client (it may reconnect; unacknowledged messages are resent)."""
        conn = agent.mqtt.by_id.get(client_id) if agent.mqtt is not None else None
        if conn is None:
            raise NotFoundError(f"no connected MQTT client {client_id!r}")
        conn.close("kicked")
        return Response(status_code=204)

    router.include_router(remote_write.router(agent))

    @router.get("/api/v1/stats", tags=["stats"], dependencies=[needs_read])
    async def stats() -> dict[str, Any]:
        """Ingest statistics: rates, spool depth, storage state, rejects by reason."""
        return agent.stats()

    return router
