"""Readings over a time range: ``GET /api/v1/readings`` (JSON or DCDB CSV, streamed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from services.common import names
from services.common.auth import Role
from services.common.http import requires
from services.common.readings import Series
from services.query_api import csvimport, encode, stream
from services.query_api import spec as specs
from services.query_api.context import ApiContext
from services.query_api.csvimport import CsvError, PayloadTooLarge
from services.query_api.query import QueryError, Result, apply, check_range
from services.query_api.routes.common import interval, time_range
from services.query_api.spec import Spec

SENSOR_DOC = (
    "Sensor specification as DCDB's query tool takes it: `/a/power`, `/a/power@kW` (unit), "
    "`/a/power@0.001` (factor), `derivative(/a/energy)`, `integral(/a/power)@kWh`, "
    "`avg(/a/*/power)` (wildcards: `*` one level, `**` any). Repeat for several sensors (CSV)."
)
TIME_DOC = (
    "`now`, `now-5m`, ISO 8601 (`2026-11-30T12:00:00Z`) or an integer epoch (s, ms, us or ns)"
)


def router(ctx: ApiContext) -> APIRouter:
    read, admin = requires(Role.READ), requires(Role.ADMIN)
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
        check_range(start_ns, end_ns)
        step = interval(interval_)
        parsed = [specs.parse(s) for s in sensor]
        if format == "json" and (len(parsed) != 1 or parsed[0].has_wildcard):
            raise QueryError(
                "format=json answers exactly one sensor without wildcards; "
                "use format=csv for several"
            )
        plain = [
            stream.is_plain(p) and step is None and await ctx.catalog.virtual(p.sensor) is None
            for p in parsed
        ]
        answers: list[list[Result] | tuple[Spec, Result, str]] = []
        for p, simple in zip(parsed, plain, strict=True):
            if simple:
                # unknown sensors and impossible units fail before the body starts
                await ctx.reader.resolve(p)
                unit = await ctx.catalog.unit(p.sensor) or ""
                head = apply(p, p.sensor, unit, Series.empty(p.sensor), 0, None, "avg")
                answers.append((p, head, unit))
            else:
                answers.append(await ctx.reader.run(p, start_ns, end_ns, step, agg))
        pieces = ctx.settings.stream_pieces
        if format == "json":
            first = answers[0]
            if isinstance(first, tuple):
                spec, head, unit = first
                body = stream.json_body(
                    ctx.reader,
                    spec,
                    head,
                    start_ns,
                    end_ns,
                    pieces,
                    ctx.metrics.points.inc,
                    stored_unit=unit,
                )
                return StreamingResponse(body, media_type="application/json")
            ctx.metrics.points.inc(len(first[0]))
            chunk = ctx.settings.stream_chunk_points
            return StreamingResponse(
                encode.json_body(first[0], start_ns, end_ns, chunk), media_type="application/json"
            )
        return StreamingResponse(
            _csv(answers, start_ns, end_ns, time_format == "iso"),
            media_type="text/csv; charset=utf-8",
        )

    async def _csv(
        answers: list[list[Result] | tuple[Spec, Result, str]],
        start_ns: int,
        end_ns: int,
        iso: bool,
    ) -> AsyncIterator[bytes]:
        label: str | None = None
        for answer in answers:
            if isinstance(answer, tuple):
                spec, head, unit = answer
                if head.label != label:
                    label = head.label
                    yield encode.csv_header(label)
                async for chunk in stream.csv_lines(
                    ctx.reader,
                    spec,
                    start_ns,
                    end_ns,
                    ctx.settings.stream_pieces,
                    iso,
                    ctx.metrics.points.inc,
                    stored_unit=unit,
                ):
                    yield chunk
                continue
            for result in answer:
                ctx.metrics.points.inc(len(result))
                if result.label != label:
                    label = result.label
                    yield encode.csv_header(label)
                for chunk in encode.csv_body(result, ctx.settings.stream_chunk_points, iso):
                    yield chunk
        if label is None:
            yield encode.csv_header("Value")

    @r.post(
        "/import",
        dependencies=[admin],
        summary="Import readings from CSV (long `Sensor,Time,Value` or wide `Time,<sensor>,...`)",
        openapi_extra={
            "requestBody": {
                "content": {"text/csv": {"schema": {"type": "string"}}},
                "required": True,
            }
        },
        responses={
            400: {"description": "a bad row (line number in the detail); nothing was written"},
            413: {"description": "body larger than import_max_bytes"},
        },
    )
    async def import_csv(
        request: Request,
        prefix: Annotated[
            str | None, Query(description="Put every sensor under this prefix, e.g. /site2")
        ] = None,
    ) -> dict[str, int]:
        ctx.metrics.requests.labels("import").inc()
        body = bytearray()
        async for part in request.stream():
            body.extend(part)
            if len(body) > ctx.settings.import_max_bytes:
                raise PayloadTooLarge(
                    f"CSV body larger than import_max_bytes ({ctx.settings.import_max_bytes}); "
                    "split it (kelvin csvimport does)"
                )
        try:
            text = body.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise CsvError(f"the CSV is not UTF-8 (byte {exc.start})") from None
        if prefix:
            names.validate_prefix(prefix)
        batch = csvimport.parse(text, prefix)
        await ctx.storage.write(batch)
        return {"imported": len(batch), "sensors": len(set(batch.sensors))}

    return r
