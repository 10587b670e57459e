"""``/api/v1/jobs``: jobs (DCDB job data) with their energy, cooling cost, duration, nodes and peak inlet."""

from __future__ import annotations

from functools import cache
from typing import Any

from fastapi import APIRouter, Query

from services.common import times
from services.common.auth import Role
from services.common.errors import NotFoundError
from services.common.http import requires
from services.common.thermal import Hall, reference_hall
from services.query_api.accounting import NS, AccountingConfig, account, placed_by
from services.query_api.context import ApiContext
from services.query_api.routes.common import time_range


@cache
def _hall(path: str | None) -> Hall:
    if path is None:
        return reference_hall()
    from services.common.halls.hallfile import load_hall

    return load_hall(path)


def accounting_config(ctx: ApiContext) -> AccountingConfig:
    s = ctx.settings.jobs
    return AccountingConfig(
        _hall(str(s.hall_file) if s.hall_file else None),
        s.power_sensor,
        s.inlet_sensor,
        s.allocator_prefix,
        s.margin_s,
        s.grid_step_s,
    )


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["jobs"])

    @r.get("/jobs", dependencies=[requires(Role.READ)])
    async def jobs(
        start: str | None = Query(None, description="jobs overlapping [start, end): now-1d, ISO"),
        end: str | None = Query(None, description="default now"),
        node: str | None = Query(None, description="only jobs on this node"),
        energy: bool = Query(True, description="false: the job records only"),
    ) -> dict[str, Any]:
        """Jobs that ran in the range, each with its accounting (``energy=true``)."""
        start_ns, end_ns = time_range(ctx, start, end)
        cfg = accounting_config(ctx)
        records = await ctx.storage.jobs(start_ns, end_ns, node)
        limit = ctx.settings.jobs.max_jobs
        out: dict[str, Any] = {"truncated": len(records) > limit}
        records = records[:limit]
        if not energy:
            out["jobs"] = [r.model_dump() for r in records]
            return out
        now = times.now_ns()
        first = min((r.start_ns for r in records), default=start_ns)
        policies = await placed_by(ctx.storage, cfg.allocator_prefix, first - 60 * NS, end_ns)
        out["jobs"] = [await account(ctx.storage, r, cfg, now, policies) for r in records]
        return out

    @r.get("/jobs/{job_id}", dependencies=[requires(Role.READ)], responses={404: {}})
    async def job(job_id: str, domain: str = Query("default")) -> dict[str, Any]:
        """One job's energy (IT and attributed cooling), duration, nodes and peak inlet."""
        rec = await ctx.storage.get_job(job_id, domain)
        if rec is None:
            raise NotFoundError(f"no job {job_id!r} (domain {domain!r}) in the stored job data")
        return await account(ctx.storage, rec, accounting_config(ctx), times.now_ns())

    return r
