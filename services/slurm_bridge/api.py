"""The bridge's own HTTP routes: prolog/epilog notifications in, status out."""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from services.common.auth import Role
from services.common.http import requires
from services.slurm_bridge.reconcile import Reconciler


class NotificationIn(BaseModel):
    """What the shipped PrologSlurmctld/EpilogSlurmctld script sends: a hint, never trusted
    beyond "look now" (the round reads Slurm itself) and the time it arrived."""

    model_config = ConfigDict(extra="ignore")
    event: Literal["start", "end"]
    job_id: str = Field(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z_.+-]+$")


def router(rec: Reconciler) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["slurm-bridge"])

    @r.post("/notify", status_code=202, dependencies=[requires(Role.WRITE)])
    async def notify(body: NotificationIn) -> dict[str, Any]:
        """A job started or ended: reconcile now (and keep the exact time)."""
        rec.notify(body.event, body.job_id, time.time_ns())
        return {"accepted": True}

    @r.get("/status", dependencies=[requires(Role.READ)])
    async def status() -> dict[str, Any]:
        """The last round: placements made, jobs waiting and why, errors."""
        return {"mode": rec.settings.mode, "slurm_api": rec.slurm.name, **rec.status}

    return r
