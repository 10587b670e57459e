"""The allocator's workload-manager routes (``/api/v1/cluster``): the bridge's report in, placements out."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from services.allocator.cluster import ClusterIn, ReportError
from services.allocator.runtime import AllocatorCore
from services.common.auth import Role
from services.common.http import requires


def router(core: AllocatorCore) -> APIRouter:
    r = APIRouter(prefix="/api/v1/cluster", tags=["cluster"])

    @r.post("/sync", dependencies=[requires(Role.ADMIN)], responses={409: {}, 422: {}})
    async def sync(body: ClusterIn) -> dict[str, Any]:
        """Report every hall node's state and every job holding or waiting for hall nodes
        (managed ones in scheduling order); the answer places the waiting managed jobs."""
        try:
            return core.sync(body).as_dict()
        except ReportError:
            core.metrics.rejected_requests.labels("cluster").inc()
            raise

    @r.get("", dependencies=[requires(Role.READ)])
    async def status() -> dict[str, Any]:
        """Whether the allocator follows a workload manager, when it last reported, and the
        jobs holding nodes (placed: chosen, waiting for the manager to start them)."""
        last = core.last_sync_ns
        book = core.book
        return {
            "cluster": core.settings.cluster,
            "last_sync_ns": last,
            "last_sync_age_s": None if last is None else (time.time_ns() - last) / 1e9,
            "unavailable_nodes": [int(i) for i in book.state.unavailable.nonzero()[0]],
            "placed": [j.to_dict() for j in book.placed()],
            "running": [j.to_dict() for j in book.running()],
            "waiting": [j.to_dict() for j in book.queued()],
        }

    return r
