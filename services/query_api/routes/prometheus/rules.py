"""``/prometheus/api/v1/rules`` and ``/alerts``: rule groups and active alerts, as Prometheus shows them.

Grafana lists them from its Prometheus data source; the console's alert panel reads
``/alerts``. Without a rule manager (no rules configured) both answer empty lists.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from services.query_api.context import ApiContext
from services.query_api.routes.prometheus.params import BadData, ok
from services.query_api.routes.prometheus.query import fail


def router(ctx: ApiContext, read: object) -> APIRouter:
    r = APIRouter(prefix="/prometheus/api/v1", tags=["prometheus"], dependencies=[read])  # type: ignore[list-item]

    @r.get("/rules", summary="Rule groups with their rules' state (recording and alerting)")
    async def rules(type: str | None = None) -> Response:
        ctx.metrics.requests.labels("prometheus_rules").inc()
        if type not in (None, "", "alert", "record"):
            return fail(
                ctx,
                "bad_data",
                BadData(f'invalid parameter "type": unsupported type "{type}"').args[0],
            )
        data: dict[str, Any] = ctx.rules.rules_api(type or None) if ctx.rules else {"groups": []}
        return ok(data)

    @r.get("/alerts", summary="Active (pending and firing) alerts")
    async def alerts() -> Response:
        ctx.metrics.requests.labels("prometheus_alerts").inc()
        return ok({"alerts": ctx.rules.alerts_api() if ctx.rules else []})

    return r
