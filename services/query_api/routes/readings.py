"""Readings over a time range: ``GET /api/v1/readings`` (JSON or DCDB CSV, streamed)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from services.query_api import encode
from services.query_api import spec as specs
from services.query_api.context import ApiContext
from services.query_api.query import QueryError, Result
from services.query_api.routes.common import auth, interval, time_range

SENSOR_DOC = (
    "Sensor specification as DCDB's query tool takes it: `/a/power`, `/a/power@kW` (unit), "
    "`/a/power@0.001` (factor), `derivative(/a/energy)`, `integral(/a/power)@kWh`, "
    "`avg(/a/*/power)` (wildcards: `*` one level, `**` any). Repeat for several sensors (CSV)."
)
TIME_DOC = (
    "`now`, `now-5m`, ISO 8601 (`2026-11-30T12:00:00Z`) or an integer epoch (s, ms, us or ns)"
)


def router(ctx: ApiContext) -> APIRouter:
    read, _ = auth(ctx)
    r = APIRouter(prefix="/api/v1", tags=["readings"])

    @r.get(
        "/readings",
        dependencies=[read],
        summary="Readings of sensors over a time range, as JSON or CSV",
        responses={
            200: {
                "description": "JSON `{sensor, unit, label, start_ns, end_ns, count, timestamps_ns, "
                "values}` (non-finite values are null) or CSV `Sensor,Time,Value`",
                "content": {"application/json": {}, "text/csv": {}},
            },
            400: {"description": "bad specification, time, interval or unit"},
            404: {"description": "unknown sensor"},
        },
    )
    async def readings(
        sensor: Annotated[list[str], Query(description=SENSOR_DOC)],
        start: Annotated[
            str | None, Query(description=f"Range start (inclusive): {TIME_DOC}; default now-1h")
        ] = None,
        end: Annotated[
            str | None, Query(description=f"Range end (exclusive): {TIME_DOC}; default now")
        ] = None,
        format: Annotated[Literal["json", "csv"], Query(description="Response format")] = "json",
        time_format: Annotated[
            Literal["iso", "ns"],
            Query(description="CSV time column: ISO 8601 with ns, or raw ns since the epoch"),
        ] = "iso",
        interval_: Annotated[
            str | None,
            Query(
                alias="interval", description="Resample into buckets of this length (`10s`, `5m`)"
            ),
        ] = None,
        agg: Annotated[
            Literal["avg", "min", "max", "sum", "count", "first", "last"],
            Query(description="How a bucket is reduced when resampling"),
        ] = "avg",
    ) -> StreamingResponse:
        ctx.metrics.requests.labels("readings").inc()
        start_ns, end_ns = time_range(ctx, start, end)
        step = interval(interval_)
        parsed = [specs.parse(s) for s in sensor]
        if format == "json" and (len(parsed) != 1 or parsed[0].has_wildcard):
            raise QueryError(
                "format=json answers exactly one sensor without wildcards; "
                "use format=csv for several"
            )
        results: list[Result] = []
        for p in parsed:
            results.extend(await ctx.reader.run(p, start_ns, end_ns, step, agg))
        ctx.metrics.points.inc(sum(len(x) for x in results))
        chunk = ctx.settings.stream_chunk_points
        body: Iterator[bytes]
        if format == "json":
            body = encode.json_body(results[0], start_ns, end_ns, chunk)
            return StreamingResponse(body, media_type="application/json")
        body = encode.csv_body(results, chunk, iso=time_format == "iso")
        return StreamingResponse(body, media_type="text/csv; charset=utf-8")

    return r
