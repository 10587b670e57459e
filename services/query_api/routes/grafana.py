"""The Grafana JSON data source protocol (plugin ``simpod-json-datasource``) under ``/grafana``.

Set the data source URL to ``http://host:8080/grafana``. A panel target is
either the metric ``sensor`` with a payload (``sensor``, ``operation``,
``unit``, ``agg``) built in the query editor, or any sensor specification
typed as the target (``avg(/hall/row0/*/power)@kW``). Answers are resampled
to Grafana's ``intervalMs`` when they hold more than ``maxDataPoints`` points.
Variables browse the hierarchy: the query ``/hall`` lists the children of
``/hall``, so ``$row`` = ``/hall`` and ``$rack`` = ``$row`` chain level by level;
a query with ``*`` lists the matching sensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Body
from pydantic import BaseModel, ConfigDict, Field

from services.common import names, times
from services.common.auth import Role
from services.common.errors import NotFoundError
from services.common.http import requires
from services.query_api import operations
from services.query_api import spec as specs
from services.query_api.context import ApiContext
from services.query_api.query import Result
from services.query_api.routes.common import parse_time_ns

OPERATIONS = ["none", *specs.OPERATIONS]
BUCKETS = ["avg", "min", "max", "sum", "count", "first", "last"]
MAX_OPTIONS = 2000


class Range(BaseModel):
    model_config = ConfigDict(extra="allow")

    from_: str = Field(alias="from")
    to: str


class Target(BaseModel):
    model_config = ConfigDict(extra="allow")

    target: str = ""
    refId: str = "A"  # Grafana spells it so
    payload: dict[str, Any] | str | None = None
    hide: bool = False


class QueryIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    range: Range
    targets: list[Target]
    intervalMs: int | None = Field(None, ge=1)
    maxDataPoints: int | None = Field(None, ge=1)


class MetricsIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    metric: str | None = None
    payload: dict[str, Any] | None = None


class OptionsIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    metric: str | None = None
    payload: dict[str, Any] | None = None
    name: str


class VariableIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    payload: dict[str, Any] | str | None = None
    range: Range | None = None


def _spec_of(t: Target) -> str:
    """The sensor specification a target stands for."""
    payload = t.payload if isinstance(t.payload, dict) else {}
    if t.target and t.target != "sensor":
        return t.target
    sensor = str(payload.get("sensor") or "").strip()
    if not sensor:
        raise specs.SpecError(f"target {t.refId}: choose a sensor")
    op = str(payload.get("operation") or "none")
    unit = str(payload.get("unit") or "").strip()
    text = sensor if op == "none" else f"{op}({sensor})"
    return f"{text}@{unit}" if unit else text


def router(ctx: ApiContext) -> APIRouter:
    read = requires(Role.READ)
    r = APIRouter(prefix="/grafana", tags=["grafana"], dependencies=[read])

    @r.get("", include_in_schema=False)
    @r.get("/", summary="Test connection")
    async def test_connection() -> dict[str, str]:
        ctx.reader  # noqa: B018 (503 while storage is not open)
        return {"status": "ok", "service": "kelvin"}

    @r.post("/metrics", summary="Metrics the query editor offers")
    async def metrics(body: MetricsIn | None = Body(None)) -> list[dict[str, Any]]:  # noqa: B008
        ctx.metrics.requests.labels("grafana_metrics").inc()
        return [
            {
                "label": "Sensor",
                "value": "sensor",
                "payloads": [
                    {
                        "label": "Prefix",
                        "name": "prefix",
                        "type": "input",
                        "placeholder": "/hall/row0 (narrows the sensor list)",
                        "reloadMetric": True,
                    },
                    {"label": "Sensor", "name": "sensor", "type": "select", "width": 40},
                    {
                        "label": "Operation",
                        "name": "operation",
                        "type": "select",
                        "options": [{"label": o, "value": o} for o in OPERATIONS],
                    },
                    {"label": "Unit", "name": "unit", "type": "input", "placeholder": "kW"},
                    {
                        "label": "Resample by",
                        "name": "agg",
                        "type": "select",
                        "options": [{"label": b, "value": b} for b in BUCKETS],
                    },
                ],
            }
        ]

    @r.post("/metric-payload-options", summary="Options of a payload select box")
    async def payload_options(body: OptionsIn) -> list[dict[str, str]]:
        ctx.metrics.requests.labels("grafana_options").inc()
        if body.name == "operation":
            return [{"label": o, "value": o} for o in OPERATIONS]
        if body.name == "agg":
            return [{"label": b, "value": b} for b in BUCKETS]
        if body.name != "sensor":
            return []
        prefix = str((body.payload or {}).get("prefix") or "/").strip() or "/"
        found = await ctx.catalog.sensors(names.validate_prefix(prefix))
        return [{"label": n, "value": n} for n in found[:MAX_OPTIONS]]

    @r.post("/query", summary="Panel data: one time series per sensor")
    async def query(body: QueryIn) -> list[dict[str, Any]]:
        ctx.metrics.requests.labels("grafana_query").inc()
        now = times.now_ns()
        start = parse_time_ns(body.range.from_, now, "range.from")
        end = parse_time_ns(body.range.to, now, "range.to") + 1  # Grafana's "to" is inclusive
        out: list[dict[str, Any]] = []
        for t in body.targets:
            if t.hide:
                continue
            payload = t.payload if isinstance(t.payload, dict) else {}
            parsed = specs.parse(_spec_of(t))
            agg = str(payload.get("agg") or "avg")
            if agg not in BUCKETS:
                raise specs.SpecError(
                    f"target {t.refId}: resampling aggregate {agg!r} is unknown; "
                    f"expected one of {', '.join(BUCKETS)}"
                )
            results = await ctx.reader.run(parsed, start, end)
            for res in results:
                res = _fit(parsed, res, start, end, body, agg)
                out.append({"target": _label(res), "datapoints": _points(res)})
        ctx.metrics.points.inc(sum(len(x["datapoints"]) for x in out))
        return out

    @r.post(
        "/variable", summary="Values of a dashboard variable: children of a prefix, or a pattern"
    )
    async def variable(body: VariableIn) -> list[dict[str, str]]:
        ctx.metrics.requests.labels("grafana_variable").inc()
        payload = body.payload
        text = payload if isinstance(payload, str) else str((payload or {}).get("target") or "/")
        text = text.strip() or "/"
        if "*" in text:
            return [
                {"__text": n, "__value": n} for n in (await ctx.catalog.expand(text))[:MAX_OPTIONS]
            ]
        kids = await ctx.catalog.children(names.validate_prefix(text))
        if kids is None:
            raise NotFoundError(f"nothing exists at or below {text!r}")
        return [{"__text": k.label, "__value": k.name} for k in kids]

    @r.post("/tag-keys", summary="Ad hoc filter keys (none)")
    async def tag_keys() -> list[dict[str, str]]:
        return []

    @r.post("/tag-values", summary="Ad hoc filter values (none)")
    async def tag_values() -> list[dict[str, str]]:
        return []

    return r


def _fit(parsed: specs.Spec, res: Result, start: int, end: int, body: QueryIn, agg: str) -> Result:
    """Resample to Grafana's interval when there are more points than the panel can show."""
    limit = body.maxDataPoints or 1000
    if len(res) <= limit or parsed.aggregate:
        return res
    interval_ns: int | None = max((body.intervalMs or 1) * 1_000_000, -(-(end - start) // limit))
    if interval_ns is not None and interval_ns >= end - start:
        interval_ns = None  # one bucket: the whole range (also keeps it inside int64)
    ts, vs = operations.aggregate(agg, res.timestamps_ns, res.values, start, interval_ns)
    return Result(res.sensor, agg, "" if agg == "count" else res.unit, ts, vs)


def _label(res: Result) -> str:
    unit = f" [{res.unit}]" if res.unit else ""
    return f"{res.sensor}{unit}" if res.label == "Value" else f"{res.label} {res.sensor}{unit}"


def _points(res: Result) -> list[list[float | int | None]]:
    ms = (res.timestamps_ns // 1_000_000).tolist()
    vals = [v if np.isfinite(v) else None for v in res.values.tolist()]
    return [[v, t] for v, t in zip(vals, ms, strict=True)]
