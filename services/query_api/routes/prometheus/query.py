"""``/prometheus/api/v1/query`` and ``query_range``: PromQL evaluated over Kelvin's sensors."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import numpy as np
from fastapi import APIRouter, Request, Response

from services.common.errors import KelvinError, RetryableStorageError, TimeSpecError
from services.query_api import promql
from services.query_api.context import ApiContext
from services.query_api.promql import Engine, EvalError, PromQLError
from services.query_api.promql.ast import ValueType
from services.query_api.promql.source import KelvinSource
from services.query_api.routes.prometheus import encode
from services.query_api.routes.prometheus.params import (
    BadData,
    Params,
    one,
    openapi,
    range_steps,
    read_params,
    time_ns,
)


def fail(ctx: ApiContext, kind: str, message: str, status: int = 400) -> Response:
    """Prometheus' error envelope; counted by kind in ``rejects_total``."""
    import orjson

    ctx.metrics.rejects.labels(f"prometheus_{kind}").inc()
    body = {"status": "error", "errorType": kind, "error": message}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def guarded(
    ctx: ApiContext, request: Request, fn: Callable[[Params], Awaitable[Response]]
) -> Response:
    """Run a handler with Prometheus' error mapping: bad input 400, evaluation failure 422."""
    try:
        return await fn(await read_params(request))
    except (BadData, TimeSpecError) as exc:
        return fail(ctx, "bad_data", str(exc))
    except PromQLError as exc:
        if "nests deeper" in str(exc):
            ctx.metrics.rejects.labels("prometheus_too_deep").inc()
        return fail(ctx, "bad_data", f'invalid parameter "query": {exc}')
    except EvalError as exc:
        return fail(ctx, "execution", str(exc), 422)
    except RetryableStorageError as exc:  # Prometheus' "unavailable": try again later
        return fail(ctx, "unavailable", str(exc), 503)
    except KelvinError as exc:
        return fail(ctx, "execution", str(exc), 422)


def engine(ctx: ApiContext) -> Engine:
    s = ctx.settings
    return Engine(
        KelvinSource(ctx.reader, s.prometheus_max_series),
        round(s.prometheus_lookback_s * 1e9),
        s.prometheus_max_samples,
    )


def parse_query(params: Params) -> promql.ast.Expr:
    text = one(params, "query")
    return promql.parse(text or "")


def router(ctx: ApiContext, read: object) -> APIRouter:
    r = APIRouter(prefix="/prometheus/api/v1", tags=["prometheus"], dependencies=[read])  # type: ignore[list-item]

    @r.get("/query", summary="Instant query (PromQL)", operation_id="prometheus_query_get",
           openapi_extra=openapi("query", "time"))  # fmt: skip
    @r.post("/query", summary="Instant query (PromQL)", operation_id="prometheus_query_post")
    async def query(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_query").inc()

        async def run(params: Params) -> Response:
            t = time_ns(params, "time", time.time_ns() // 1_000_000 * 1_000_000)
            expr = parse_query(params)
            value = await engine(ctx).instant(expr, t)
            return _json(encode.envelope(encode.instant_result(value, t)))

        return await guarded(ctx, request, run)

    @r.get("/query_range", summary="Range query (PromQL)", operation_id="prometheus_query_range_get",
           openapi_extra=openapi("query", "start", "end", "step"))  # fmt: skip
    @r.post(
        "/query_range", summary="Range query (PromQL)", operation_id="prometheus_query_range_post"
    )
    async def query_range(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_query_range").inc()

        async def run(params: Params) -> Response:
            start, end, step = range_steps(params)
            expr = parse_query(params)
            if expr.type not in (ValueType.VECTOR, ValueType.SCALAR):
                raise BadData(
                    f'invalid parameter "query": invalid expression type "{expr.type.documented}" '
                    "for range query, must be Scalar or instant Vector"
                )
            value = await engine(ctx).range(expr, start, end, step)
            steps = np.arange(start, end + 1, step, dtype=np.int64)
            return _json(encode.envelope(encode.range_result(value, steps)))

        return await guarded(ctx, request, run)

    return r


def _json(body: bytes) -> Response:
    return Response(body, media_type="application/json")
