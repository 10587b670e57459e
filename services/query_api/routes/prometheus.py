"""A read-only subset of the Prometheus HTTP API under ``/prometheus`` (for Grafana, alerting).

Point Grafana's built-in Prometheus data source at ``http://host:8080/prometheus``.
Endpoints answer GET and form-encoded POST like Prometheus 2.x, with the same
envelope: ``{"status": "success", "data": ...}`` or
``{"status": "error", "errorType": "bad_data", "error": "..."}`` (HTTP 400).
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response

from services.common import times
from services.common.auth import Role
from services.common.errors import KelvinError, TimeSpecError
from services.common.http import requires
from services.query_api import promql
from services.query_api.context import ApiContext
from services.query_api.promeval import Evaluator, labels_of, matches
from services.query_api.promql import PromQLError
from services.query_api.routes.common import MAX_NS, in_range

MAX_POINTS = 11_000
"""Prometheus' limit of steps per series in a range query."""


class BadData(KelvinError):
    pass


def _ok(data: Any) -> Response:
    return Response(
        orjson.dumps({"status": "success", "data": data}), media_type="application/json"
    )


def _fail(ctx: ApiContext, kind: str, message: str, status: int = 400) -> Response:
    ctx.metrics.rejects.labels(f"prometheus_{kind}").inc()
    body = {"status": "error", "errorType": kind, "error": message}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def _params(request: Request) -> list[tuple[str, str]]:
    items = list(request.query_params.multi_items())
    if request.method == "POST":
        body = (await request.body()).decode("utf-8", "replace")
        items.extend(parse_qsl(body, keep_blank_values=True))
    return items


def _one(params: list[tuple[str, str]], key: str) -> str | None:
    for k, v in params:
        if k == key:
            return v
    return None


def _time_ns(params: list[tuple[str, str]], key: str, default_ns: int | None = None) -> int:
    raw = _one(params, key)
    if raw is None or raw == "":
        if default_ns is None:
            raise BadData(f'invalid parameter "{key}": cannot parse "" to a valid timestamp')
        return default_ns
    ns: int | None = None
    try:
        value = float(raw)
        if math.isfinite(value):
            ns = round(value * 1000) * 1_000_000  # Prometheus works in ms
    except ValueError:
        pass
    if ns is None:
        with contextlib.suppress(TimeSpecError):
            ns = times.parse_time(raw)
    if ns is None or not in_range(ns):
        raise BadData(f'invalid parameter "{key}": cannot parse "{raw}" to a valid timestamp')
    return ns


def _step_ns(raw: str | None) -> int:
    if not raw:
        raise BadData('invalid parameter "step": cannot parse "" to a valid duration')
    try:
        seconds = float(raw)
    except ValueError:
        seconds = promql.parse_duration_s(raw) if raw[-1:].isalpha() else -1.0
        if seconds <= 0 and not raw[:1].isdigit():
            raise BadData(
                f'invalid parameter "step": cannot parse "{raw}" to a valid duration'
            ) from None
    step_ns = round(seconds * 1000) * 1_000_000 if math.isfinite(seconds) else 0
    if seconds == math.inf or step_ns > MAX_NS:
        raise BadData(
            f'invalid parameter "step": cannot parse "{raw}" to a valid duration. '
            "It overflows int64"
        )
    if step_ns <= 0:  # also a step under 0.5 ms, which Prometheus' ms resolution makes zero
        raise BadData(
            'invalid parameter "step": zero or negative query resolution step widths are not '
            "accepted. Try a positive integer"
        )
    return step_ns


def fmt_value(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``, as Prometheus writes sample values."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    r = repr(v)
    if "e" in r:
        return np.format_float_positional(v, unique=True, trim="-")
    return r[:-2] if r.endswith(".0") else r


def fmt_time(ns: int) -> float | int:
    ms = ns // 1_000_000
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


_PARAM_DOCS = {
    "query": "PromQL expression (the subset in docs/query-api.md)",
    "time": "evaluation time: unix seconds or RFC 3339 (default now)",
    "start": "range start: unix seconds or RFC 3339",
    "end": "range end: unix seconds or RFC 3339",
    "step": "resolution: seconds or a duration such as 15s",
    "match[]": "series selector, repeatable",
}


def _doc(*names_: str) -> dict[str, Any]:
    """OpenAPI parameters for a route that reads them itself (GET query or POST form)."""
    params = [
        {
            "name": n,
            "in": "query",
            "required": False,
            "schema": {"type": "array", "items": {"type": "string"}}
            if n == "match[]"
            else {"type": "string"},
            "description": _PARAM_DOCS[n],
        }
        for n in names_
    ]
    return {"parameters": params}


def router(ctx: ApiContext) -> APIRouter:
    read = requires(Role.READ)
    r = APIRouter(prefix="/prometheus/api/v1", tags=["prometheus"], dependencies=[read])

    async def guarded(request: Request, fn: Any) -> Response:
        try:
            response: Response = await fn(await _params(request))
            return response
        except (BadData, TimeSpecError) as exc:
            return _fail(ctx, "bad_data", str(exc))
        except PromQLError as exc:
            return _fail(ctx, "bad_data", f'invalid parameter "query": {exc}')
        except KelvinError as exc:
            return _fail(ctx, "execution", str(exc), 422)

    async def evaluate(params: list[tuple[str, str]], steps: np.ndarray[Any, Any]) -> Any:
        query = _one(params, "query")
        if query is None:
            raise PromQLError("1:1: parse error: no expression found in input")
        expr = promql.parse(query)
        ev = Evaluator(
            ctx.reader,
            steps,
            round(ctx.settings.prometheus_lookback_s * 1e9),
            ctx.settings.prometheus_max_series,
        )
        return expr, await ev.eval(expr)

    @r.get(
        "/query",
        summary="Instant query (PromQL subset)",
        operation_id="prometheus_query_get",
        openapi_extra=_doc("query", "time"),
    )
    @r.post("/query", summary="Instant query (PromQL subset)", operation_id="prometheus_query_post")
    async def query(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_query").inc()

        async def run(params: list[tuple[str, str]]) -> Response:
            t = _time_ns(params, "time", time.time_ns())
            expr, value = await evaluate(params, np.array([t], dtype=np.int64))
            ts = fmt_time(t)
            if isinstance(value, np.ndarray):
                return _ok({"resultType": "scalar", "result": [ts, fmt_value(float(value[0]))]})
            if isinstance(expr, promql.Selector) and expr.range_s is not None:
                result = [
                    {
                        "metric": s.labels,
                        "values": [
                            [fmt_time(a), fmt_value(b)]
                            for a, b in zip(
                                s.timestamps_ns.tolist(), s.values.tolist(), strict=True
                            )
                        ],
                    }
                    for s in value
                ]
                return _ok({"resultType": "matrix", "result": _sorted(result)})
            result = [
                {"metric": s.labels, "value": [ts, fmt_value(float(s.values[0]))]}
                for s in value
                if not math.isnan(s.values[0])
            ]
            return _ok({"resultType": "vector", "result": _sorted(result)})

        return await guarded(request, run)

    @r.get(
        "/query_range",
        summary="Range query (PromQL subset)",
        operation_id="prometheus_query_range_get",
        openapi_extra=_doc("query", "start", "end", "step"),
    )
    @r.post(
        "/query_range",
        summary="Range query (PromQL subset)",
        operation_id="prometheus_query_range_post",
    )
    async def query_range(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_query_range").inc()

        async def run(params: list[tuple[str, str]]) -> Response:
            start = _time_ns(params, "start")
            end = _time_ns(params, "end")
            step = _step_ns(_one(params, "step"))
            if end < start:
                raise BadData(
                    'invalid parameter "end": end timestamp must not be before start time'
                )
            if (end - start) // step > MAX_POINTS:
                raise BadData(
                    "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing "
                    "the query resolution (?step=XX)"
                )
            steps = np.arange(start, end + 1, step, dtype=np.int64)
            expr, value = await evaluate(params, steps)
            if isinstance(expr, promql.Selector) and expr.range_s is not None:
                raise BadData(
                    'invalid parameter "query": invalid expression type "range vector" for range '
                    "query, must be Scalar or instant Vector"
                )
            if isinstance(value, np.ndarray):
                pts = [
                    [fmt_time(t), fmt_value(v)]
                    for t, v in zip(steps.tolist(), value.tolist(), strict=True)
                ]
                return _ok({"resultType": "matrix", "result": [{"metric": {}, "values": pts}]})
            tlist = [fmt_time(t) for t in steps.tolist()]
            result = []
            for s in value:
                vals = s.values.tolist()
                pts = [[t, fmt_value(v)] for t, v in zip(tlist, vals, strict=True) if v == v]
                if pts:
                    result.append({"metric": s.labels, "values": pts})
            return _ok({"resultType": "matrix", "result": _sorted(result)})

        return await guarded(request, run)

    async def selected(params: list[tuple[str, str]], required: bool) -> list[dict[str, str]]:
        selectors = [v for k, v in params if k == "match[]"]
        if not selectors:
            if required:
                raise BadData("no match[] parameter provided")
            return [labels_of(s) for s in await ctx.catalog.sensors("/")]
        out: dict[str, dict[str, str]] = {}
        all_sensors = await ctx.catalog.sensors("/")
        for text in selectors:
            expr = promql.parse(text)
            if not isinstance(expr, promql.Selector) or expr.range_s is not None:
                raise BadData(f'invalid parameter "match[]": {text} is not a vector selector')
            for s in all_sensors:
                lab = labels_of(s)
                if matches(lab, expr.matchers):
                    out[s] = lab
        return [out[k] for k in sorted(out)]

    @r.get(
        "/series",
        summary="Series matching selectors",
        operation_id="prometheus_series_get",
        openapi_extra=_doc("match[]", "start", "end"),
    )
    @r.post("/series", summary="Series matching selectors", operation_id="prometheus_series_post")
    async def series(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_series").inc()

        async def run(params: list[tuple[str, str]]) -> Response:
            _time_ns(params, "start", 0)
            _time_ns(params, "end", 0)
            return _ok(await selected(params, required=True))

        return await guarded(request, run)

    @r.get(
        "/labels",
        summary="Label names",
        operation_id="prometheus_labels_get",
        openapi_extra=_doc("match[]"),
    )
    @r.post("/labels", summary="Label names", operation_id="prometheus_labels_post")
    async def labels(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_labels").inc()

        async def run(params: list[tuple[str, str]]) -> Response:
            found: set[str] = set()
            for lab in await selected(params, required=False):
                found.update(lab)
            return _ok(sorted(found))

        return await guarded(request, run)

    @r.get("/label/{name}/values", summary="Values of one label")
    async def label_values(name: str, request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_label_values").inc()

        async def run(params: list[tuple[str, str]]) -> Response:
            if not name or not (name[0].isalpha() or name[0] == "_"):
                raise BadData(f'invalid label name: "{name}"')
            found = {lab[name] for lab in await selected(params, required=False) if name in lab}
            return _ok(sorted(found))

        return await guarded(request, run)

    @r.get("/status/buildinfo", summary="Build information (Grafana asks for it)")
    async def buildinfo() -> Response:
        return _ok(
            {
                "version": "2.42.0",
                "revision": "kelvin",
                "branch": "kelvin",
                "buildUser": "kelvin",
                "buildDate": "",
                "goVersion": "",
            }
        )

    @r.get("/metadata", summary="Metric metadata (units of sensors)")
    async def metadata() -> Response:
        out: dict[str, list[dict[str, str]]] = {}
        for meta in await ctx.storage.list_metadata("/"):
            name = labels_of(meta.name)["__name__"]
            entry = {"type": "gauge", "help": meta.name, "unit": meta.unit or ""}
            if entry not in out.setdefault(name, []):
                out[name].append(entry)
        return _ok(out)

    @r.get(
        "/query_exemplars",
        summary="Exemplars (none)",
        operation_id="prometheus_exemplars_get",
        openapi_extra=_doc(),
    )
    @r.post(
        "/query_exemplars", summary="Exemplars (none)", operation_id="prometheus_exemplars_post"
    )
    async def exemplars() -> Response:
        return _ok([])

    return r


def _sorted(result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(result, key=lambda x: sorted(x["metric"].items()))
