"""The Prometheus HTTP API under ``/prometheus`` (Grafana's Prometheus data source, vmalert).

Point Grafana's built-in Prometheus data source at ``http://host:8080/prometheus``.
Endpoints answer GET and form-encoded POST like Prometheus 2.42, with its
envelope: ``{"status": "success", "data": ...}`` or ``{"status": "error",
"errorType": "bad_data", "error": "..."}`` (400; 422 ``execution`` when evaluation
fails). Every route needs the read role.
"""

from __future__ import annotations

from fastapi import APIRouter

from services.common.auth import Role
from services.common.http import requires
from services.query_api.context import ApiContext
from services.query_api.routes.prometheus import meta, query, remote_read, rules


def router(ctx: ApiContext) -> APIRouter:
    read = requires(Role.READ)
    r = APIRouter()
    r.include_router(query.router(ctx, read))
    r.include_router(meta.router(ctx, read))
    r.include_router(remote_read.router(ctx, read))
    r.include_router(rules.router(ctx, read))
    return r
