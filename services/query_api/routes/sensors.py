"""Hierarchy browsing and sensor metadata: ``/api/v1/sensors``, ``/api/v1/metadata``."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from services.common import names, times
from services.common.auth import Role
from services.common.errors import KelvinError, NotFoundError
from services.common.http import requires
from services.common.sensors import SensorMetadata
from services.query_api.context import ApiContext


class ChildOut(BaseModel):
    name: str = Field(description="Full name, e.g. /a/b/c")
    label: str = Field(description="Last level of the name, e.g. c")
    is_sensor: bool = Field(
        description="Readings, metadata or a virtual definition exist under exactly this name"
    )
    has_children: bool = Field(description="Names exist below it")
    is_virtual: bool = False


class ChildrenOut(BaseModel):
    prefix: str
    children: list[ChildOut]


class NamesOut(BaseModel):
    prefix: str
    sensors: list[str]


class NonFiniteError(KelvinError, ValueError):
    """A numeric metadata field that is NaN or infinite."""

    reason = "non_finite"


class MetadataIn(BaseModel):
    """Fields to set; the ones left out keep their stored values."""

    model_config = ConfigDict(extra="forbid")

    name: str
    public_name: str | None = None
    unit: str | None = None
    scale: float | None = None
    ttl_ms: int | None = Field(None, ge=0)
    interval_ms: int | None = Field(None, ge=0)
    operations: list[str] | None = None
    integrable: bool | None = None
    monotonic: bool | None = None
    delta: bool | None = None


def router(ctx: ApiContext) -> APIRouter:
    read, admin = requires(Role.READ), requires(Role.ADMIN)
    r = APIRouter(prefix="/api/v1", tags=["sensors"])

    @r.get(
        "/sensors",
        response_model=ChildrenOut,
        dependencies=[read],
        summary="Browse the hierarchy",
        responses={404: {"description": "nothing exists at or below the prefix"}},
    )
    async def children(
        prefix: Annotated[str, Query(description="Hierarchy level to list, e.g. /hall/row0")] = "/",
    ) -> ChildrenOut:
        ctx.metrics.requests.labels("sensors").inc()
        p = names.validate_prefix(prefix)
        kids = await ctx.catalog.children(p)
        if kids is None:
            raise NotFoundError(f"nothing exists at or below {p!r}")
        return ChildrenOut(
            prefix=p,
            children=[
                ChildOut(
                    name=k.name,
                    label=k.label,
                    is_sensor=k.is_sensor,
                    has_children=k.has_children,
                    is_virtual=k.is_virtual,
                )
                for k in kids
            ],
        )

    @r.get(
        "/sensor-names",
        response_model=NamesOut,
        dependencies=[read],
        summary="Every sensor under a prefix, or matching a pattern",
    )
    async def sensor_names(
        prefix: Annotated[str, Query(description="Hierarchy level")] = "/",
        match: Annotated[
            str | None, Query(description="Wildcard pattern: * one level, ** any levels")
        ] = None,
    ) -> NamesOut:
        ctx.metrics.requests.labels("sensor_names").inc()
        p = names.validate_prefix(prefix)
        found = await ctx.catalog.expand(match) if match else await ctx.catalog.sensors(p)
        return NamesOut(prefix=p, sensors=[n for n in found if names.is_under(n, p)])

    @r.get(
        "/metadata",
        dependencies=[read],
        summary="Metadata of one sensor (unit, scale, ttl, interval, ...) and its newest reading",
        responses={404: {"description": "unknown sensor"}},
    )
    async def metadata(
        sensor: Annotated[str, Query(description="Sensor name")],
    ) -> dict[str, Any]:
        ctx.metrics.requests.labels("metadata").inc()
        names.validate(sensor)
        vdef = await ctx.catalog.virtual(sensor)
        if vdef is None and not await ctx.storage.has_sensor(sensor):
            raise NotFoundError(await ctx.catalog.missing(sensor))
        meta = await ctx.storage.get_metadata(sensor)
        out: dict[str, Any] = (
            meta.model_dump() if meta else SensorMetadata(name=sensor).model_dump()
        )
        out["operations"] = list(out.get("operations") or ())
        if vdef is not None:
            out.update(is_virtual=True, unit=vdef.get("unit") or None, virtual=vdef)
            out["interval_ms"] = vdef.get("interval_ms") or out.get("interval_ms")
            out["latest"] = None
        else:
            latest = await ctx.storage.latest(sensor)
            out["latest"] = (
                None
                if latest is None
                else {
                    "timestamp_ns": latest[0],
                    "time": times.format_iso(latest[0]),
                    "value": latest[1] if latest[1] == latest[1] else None,
                }
            )
        return out

    @r.put(
        "/metadata",
        dependencies=[admin],
        summary="Set metadata fields of a sensor (creates the sensor if needed)",
    )
    async def put_metadata(body: MetadataIn) -> dict[str, Any]:
        ctx.metrics.requests.labels("put_metadata").inc()
        names.validate(body.name)
        if body.scale is not None and not math.isfinite(body.scale):
            raise NonFiniteError(
                f"{body.name}: scale must be a finite number, got {body.scale!r} (a NaN or "
                "infinite scale would turn every later reading of the sensor into null)"
            )
        fields = body.model_dump(exclude_none=True)
        if "operations" in fields:
            fields["operations"] = tuple(fields["operations"])
        await ctx.storage.put_metadata(SensorMetadata(**fields))
        meta = await ctx.storage.get_metadata(body.name)
        assert meta is not None
        out = meta.model_dump()
        out["operations"] = list(out["operations"])
        return out

    return r
