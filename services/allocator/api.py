"""The allocator's REST API (``/api/v1``): jobs, the hall, the policy, the live model."""

from __future__ import annotations

import time
from typing import Any, Literal

import scipy.sparse as sp
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.allocator import model_wire as wire
from services.allocator.jobs import MAX_RUNTIME_S
from services.allocator.policies import REGISTRY
from services.allocator.runtime import AllocatorCore
from services.common.auth import Role
from services.common.errors import ConfigError, NotFoundError
from services.common.http import read_capped, requires


class JobIn(BaseModel):
    """A job to place."""

    model_config = ConfigDict(extra="forbid")
    size: int = Field(ge=1, description="nodes")
    runtime_s: float | None = Field(
        None, gt=0, le=MAX_RUNTIME_S, description="ends by itself after this many seconds"
    )
    comm_share: float = Field(0.0, ge=0, le=1, description="communication share C")
    stretch: bool = Field(False, description="stretch runtime_s by (1-C) + C*Lf")
    name: str | None = Field(None, max_length=200)


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str


def _problem(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def router(core: AllocatorCore) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["allocator"])
    # Jobs and configuration alike need admin: a placement becomes a real Slurm
    # placement through the bridge, so a pusher's write token must not reach it.
    read, admin = [requires(Role.READ)], [requires(Role.ADMIN)]
    counted = core.metrics.rejected_requests

    @r.post("/jobs", status_code=201, dependencies=admin, responses={202: {}, 422: {}})
    async def submit(body: JobIn, dry_run: bool = False) -> Any:
        try:
            if dry_run:
                decision = core.book.dry_run(body.size, body.comm_share)
                return JSONResponse({"decision": decision.as_dict()}, status_code=200)
            job = core.submit(body.size, body.runtime_s, body.comm_share, body.stretch, body.name)
        except ValueError as exc:
            counted.labels("unplaceable").inc()
            return _problem(422, "unplaceable", str(exc))
        if job.state == "rejected":
            counted.labels("mttf").inc()
            return _problem(
                422,
                "unplaceable",
                f"job {job.id} of {job.size} nodes would bring a processor's MTTF below "
                f"{core.allocator.min_mttf_years} years even on an otherwise idle hall",
            )
        return JSONResponse(job.to_dict(), status_code=201 if job.state == "running" else 202)

    @r.get("/jobs", dependencies=read)
    async def list_jobs(
        state: Literal["active", "running", "queued", "finished", "all"] = "active",
    ) -> dict[str, Any]:
        book = core.book
        jobs = {
            "running": book.running(),
            "queued": book.queued(),
            "active": book.running() + book.queued(),
            "finished": list(book.history),
            "all": book.running() + book.queued() + list(book.history),
        }[state]
        return {"jobs": [j.to_dict() for j in jobs]}

    @r.get("/jobs/{job_id}", dependencies=read)
    async def get_job(job_id: str) -> dict[str, Any]:
        return core.book.get(job_id).to_dict()

    @r.delete("/jobs/{job_id}", dependencies=admin, responses={404: {}, 409: {}})
    async def delete_job(job_id: str) -> Any:
        try:
            return core.cancel(job_id).to_dict()
        except NotFoundError:
            raise
        except ValueError as exc:
            return _problem(409, "conflict", str(exc))

    @r.get("/hall", dependencies=read)
    async def hall() -> dict[str, Any]:
        return core.hall_doc()

    @r.get("/policy", dependencies=read)
    async def get_policy() -> dict[str, Any]:
        return {
            "policy": core.allocator.policy_name,
            "mttf_bound_years": core.allocator.min_mttf_years,
            "available": {name: cls.summary for name, cls in sorted(REGISTRY.items())},
        }

    @r.put("/policy", dependencies=admin)
    async def put_policy(body: PolicyIn) -> Any:
        try:
            core.set_policy(body.policy)
        except ConfigError as exc:
            counted.labels("policy").inc()
            return _problem(422, "unknown_policy", str(exc))
        return await get_policy()

    @r.get("/hall/model", dependencies=read, responses={422: {}})
    async def get_model(form: wire.Form | None = None) -> Any:
        """The live D: dense rows for a dense D, COO triplets for a sparse one (or ``form``)."""
        d = core.book.model.hall.d_matrix
        n = d.shape[0]
        chosen = form or ("coo" if sp.issparse(d) else "dense")
        if chosen == "dense" and sp.issparse(d) and n > DENSE_MAX_NODES:
            return _problem(
                422,
                "too_large",
                f"a dense D of {n} nodes is {n * n:,} numbers; ask for form=coo or form=npz",
            )
        return {**core.model_meta, **wire.encode(d, chosen)}

    @r.put("/hall/model", dependencies=admin, responses={413: {}, 422: {}})
    async def put_model(request: Request) -> Any:
        """Make a D live: ``d_matrix``, ``d_coo`` or ``d_npz`` (:mod:`.model_wire`)."""
        raw = await read_capped(request, wire.MAX_BODY_BYTES)
        if raw is None:
            counted.labels("model").inc()
            return _problem(
                413, "too_large", f"a model document is at most {wire.MAX_BODY_BYTES} bytes"
            )
        try:
            body = wire.ModelIn.model_validate_json(raw)
        except ValidationError as exc:
            counted.labels("validation").inc()
            return _problem(422, "invalid_request", _fields(exc))
        try:
            d = wire.decode(body, core.book.model.n)
            core.set_model(
                d, {"source": body.source, "fit": body.fit, "updated_ns": time.time_ns()}
            )
        except ValueError as exc:
            counted.labels("model").inc()
            return _problem(422, "bad_model", str(exc))
        return {**core.model_meta, "name": core.book.model.hall.name}

    @r.delete("/hall/model", dependencies=admin)
    async def delete_model() -> dict[str, Any]:
        core.reset_model()
        return core.model_meta

    return r


DENSE_MAX_NODES = 2000
"""A sparse D is sent dense only up to this many nodes (4M numbers)."""


def _fields(exc: ValidationError | RequestValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


def install_validation_counter(app: FastAPI, core: AllocatorCore) -> None:
    """Count malformed requests (reason ``validation``) and name the offending fields."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        core.metrics.rejected_requests.labels("validation").inc()
        return _problem(422, "invalid_request", _fields(exc))
