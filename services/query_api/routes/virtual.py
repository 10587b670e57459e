"""Virtual sensors over REST: ``/api/v1/virtual`` (list) and ``/api/v1/virtual/{name}``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query
from fastapi.responses import JSONResponse

from services.common import names
from services.common.auth import Role
from services.common.errors import KelvinError
from services.common.http import requires
from services.query_api.context import ApiContext
from services.query_api.virtual.define import VirtualIn, differs
from services.query_api.virtual.engine import Engine

VirtualName = Annotated[
    str,
    Path(description="Virtual sensor name without its leading '/', e.g. hall/pue for /hall/pue"),
]


class VirtualExists(KelvinError):
    """A PUT with ``If-None-Match: *`` for a virtual sensor defined otherwise already."""

    reason = "exists"
    http_status = 412


def router(ctx: ApiContext) -> APIRouter:
    read, admin = requires(Role.READ), requires(Role.ADMIN)
    r = APIRouter(prefix="/api/v1", tags=["virtual sensors"])

    def engine() -> Engine:
        ctx.reader  # noqa: B018 (raises 503 while storage is not open)
        assert isinstance(ctx.virtual, Engine)
        return ctx.virtual

    @r.get("/virtual", dependencies=[read], summary="Every virtual sensor and its definition")
    async def list_virtual() -> dict[str, Any]:
        ctx.metrics.requests.labels("virtual_list").inc()
        defs = await ctx.catalog.virtual_defs()
        return {"virtual": [defs[k] for k in sorted(defs)]}

    @r.get(
        "/virtual/{name:path}",
        dependencies=[read],
        summary="One virtual sensor's definition",
        responses={404: {"description": "no such virtual sensor"}},
    )
    async def show_virtual(name: VirtualName) -> dict[str, Any]:
        ctx.metrics.requests.labels("virtual_show").inc()
        full = names.validate("/" + name.lstrip("/"))
        comp = await engine().compiled(full)  # raises 404
        defn = dict(await ctx.catalog.virtual(full) or {})
        defn["dependents"] = await engine().dependents(full)
        defn["lead_steps"] = comp.lead
        defn["configured"] = full in ctx.configured_virtual  # defined again at every start
        return defn

    @r.put(
        "/virtual/{name:path}",
        dependencies=[admin],
        summary="Define (or redefine) a virtual sensor",
        responses={
            200: {
                "description": "the stored definition (with inferred unit, grid interval, warnings)"
            },
            400: {
                "description": "syntax error (with position), unknown input, unit mismatch, cycle"
            },
            401: {"description": "missing or wrong bearer token"},
            412: {
                "description": "If-None-Match: * and a different definition exists (the CLI "
                "sends it unless --force; the console asks first)"
            },
        },
    )
    async def put_virtual(
        name: VirtualName,
        body: VirtualIn,
        dry_run: Annotated[bool, Query(description="Only validate; store nothing")] = False,
        if_none_match: Annotated[
            str | None,
            Header(description="'*': define only if no (different) definition exists"),
        ] = None,
    ) -> dict[str, Any]:
        ctx.metrics.requests.labels("virtual_put").inc()
        full = names.validate("/" + name.lstrip("/"))
        if if_none_match is not None and if_none_match.strip() == "*":
            old = await ctx.catalog.virtual(full)
            if old is not None and differs(old, body):
                configured = (
                    "; it is configured (query_api.virtual_sensors or the demo's): the next "
                    "start defines it again as configured"
                    if full in ctx.configured_virtual
                    else ""
                )
                raise VirtualExists(
                    f"virtual sensor {full!r} exists: {old.get('expression')}{configured}. "
                    "Redefining it drops its stored results"
                )
        return await engine().put(full, body, dry_run)

    @r.delete(
        "/virtual/{name:path}",
        dependencies=[admin],
        summary="Delete a virtual sensor and its stored results",
        responses={
            404: {"description": "no such virtual sensor"},
            400: {"description": "still used"},
        },
    )
    async def delete_virtual(name: VirtualName) -> JSONResponse:
        ctx.metrics.requests.labels("virtual_delete").inc()
        full = names.validate("/" + name.lstrip("/"))
        await engine().delete(full)
        return JSONResponse({"deleted": full})

    return r
