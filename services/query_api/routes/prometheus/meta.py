"""Series metadata endpoints: ``series``, ``labels``, ``label/<name>/values``, ``metadata``,
``query_exemplars``, ``status/buildinfo``.

``start``/``end`` narrow the answer to series with a reading in that range, as in
Prometheus; without them every sensor counts.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from services.common.promnames import Labels, series_labels
from services.query_api.context import ApiContext
from services.query_api.promql import parse_selector
from services.query_api.promql.source import matches
from services.query_api.routes.prometheus.params import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    BadData,
    Params,
    ok,
    openapi,
    time_ns,
)
from services.query_api.routes.prometheus.query import guarded, parse_query


async def _in_range(ctx: ApiContext, names: list[str], start: int, end: int) -> list[str]:
    """The sensors with a reading in ``[start, end]`` (virtual sensors always count)."""
    if start <= MIN_TIME_NS and end >= MAX_TIME_NS:
        return names
    virtual = await ctx.catalog.virtual_defs()
    out = []
    for name in names:
        if name in virtual:
            out.append(name)
            continue
        newest = await ctx.storage.latest(name)
        if newest is None or newest[0] < start:
            continue
        if newest[0] <= end or len(await ctx.storage.read(name, start, end + 1)):
            out.append(name)
    return out


async def selected(ctx: ApiContext, params: Params, required: bool) -> list[Labels]:
    selectors = [v for k, v in params if k == "match[]"]
    start = time_ns(params, "start", MIN_TIME_NS)
    end = time_ns(params, "end", MAX_TIME_NS)
    if required and not selectors:
        raise BadData("no match[] parameter provided")
    matchers = []
    for text in selectors:
        try:
            matchers.append(parse_selector(text).matchers)
        except Exception as exc:  # PromQLError: named as Prometheus names it
            raise BadData(f'invalid parameter "match[]": {exc}') from None
    names = await ctx.catalog.sensors("/")
    chosen = [
        n for n in names if not matchers or any(matches(series_labels(n), m) for m in matchers)
    ]
    return [series_labels(n) for n in await _in_range(ctx, chosen, start, end)]


def router(ctx: ApiContext, read: object) -> APIRouter:
    r = APIRouter(prefix="/prometheus/api/v1", tags=["prometheus"], dependencies=[read])  # type: ignore[list-item]

    @r.get("/series", summary="Series matching selectors", operation_id="prometheus_series_get",
           openapi_extra=openapi("match[]", "start", "end"))  # fmt: skip
    @r.post("/series", summary="Series matching selectors", operation_id="prometheus_series_post")
    async def series(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_series").inc()

        async def run(params: Params) -> Response:
            return ok([dict(lab) for lab in sorted(await selected(ctx, params, required=True))])

        return await guarded(ctx, request, run)

    @r.get("/labels", summary="Label names", operation_id="prometheus_labels_get",
           openapi_extra=openapi("match[]", "start", "end"))  # fmt: skip
    @r.post("/labels", summary="Label names", operation_id="prometheus_labels_post")
    async def labels(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_labels").inc()

        async def run(params: Params) -> Response:
            found: set[str] = set()
            for lab in await selected(ctx, params, required=False):
                found.update(k for k, _ in lab)
            return ok(sorted(found))

        return await guarded(ctx, request, run)

    @r.get("/label/{name}/values", summary="Values of one label",
           openapi_extra=openapi("match[]", "start", "end"))  # fmt: skip
    async def label_values(name: str, request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_label_values").inc()

        async def run(params: Params) -> Response:
            if (
                not name
                or not (name[0].isalpha() or name[0] == "_")
                or not all(c.isalnum() or c == "_" for c in name)
            ):
                raise BadData(f'invalid label name: "{name}"')
            found = {
                v
                for lab in await selected(ctx, params, required=False)
                for k, v in lab
                if k == name
            }
            return ok(sorted(found))

        return await guarded(ctx, request, run)

    @r.get("/status/buildinfo", summary="Build information (Grafana asks for it)")
    async def buildinfo() -> Response:
        return ok(
            {"version": "2.42.0", "revision": "kelvin", "branch": "kelvin", "buildUser": "kelvin",
             "buildDate": "", "goVersion": ""}
        )  # fmt: skip

    @r.get("/metadata", summary="Metric metadata (units of sensors)")
    async def metadata() -> Response:
        out: dict[str, list[dict[str, str]]] = {}
        for meta in await ctx.storage.list_metadata("/"):
            metric = dict(series_labels(meta.name))["__name__"]
            entry = {"type": "gauge", "help": meta.name, "unit": meta.unit or ""}
            if entry not in out.setdefault(metric, []):
                out[metric].append(entry)
        return ok(out)

    @r.get("/query_exemplars", summary="Exemplars (Kelvin stores none)",
           operation_id="prometheus_exemplars_get", openapi_extra=openapi("query", "start", "end"))  # fmt: skip
    @r.post("/query_exemplars", summary="Exemplars (Kelvin stores none)",
            operation_id="prometheus_exemplars_post")  # fmt: skip
    async def exemplars(request: Request) -> Response:
        async def run(params: Params) -> Response:
            start = time_ns(params, "start", MIN_TIME_NS)
            end = time_ns(params, "end", MAX_TIME_NS)
            if end < start:
                raise BadData(
                    'invalid parameter "end": end timestamp must not be before start time'
                )
            parse_query(params)
            empty: list[Any] = []
            return ok(empty)

        return await guarded(ctx, request, run)

    return r
