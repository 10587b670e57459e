"""Slurm through slurmrestd (OpenAPI v0.0.38, Slurm 22.05) with JWT authentication.

Headers ``X-SLURM-USER-NAME`` / ``X-SLURM-USER-TOKEN`` carry the token from
:class:`~services.slurm_bridge.tokens.TokenSource`; a 401 renews it once.
slurmrestd must run with ``SLURM_JWT=daemon`` and ``-a rest_auth/jwt``
(docs/slurm.md). Setting nodes is ``POST /job/{id}`` with ``nodes`` as a
``"n-n"`` string and ``nodelist``; ``{"hold": true|false}`` holds and releases.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from services.slurm_bridge.client import SlurmClient, SlurmError, SlurmUnavailable, Snapshot
from services.slurm_bridge.model import parse_jobs, parse_nodes
from services.slurm_bridge.tokens import TokenSource


class RestClient(SlurmClient):
    """slurmrestd over HTTP."""

    name = "slurmrestd"

    def __init__(
        self,
        url: str,
        tokens: TokenSource,
        version: str = "v0.0.38",
        timeout_s: float = 10.0,
        partitions: frozenset[str] = frozenset(),
    ) -> None:
        self.base = f"{url.rstrip('/')}/slurm/{version}"
        self.tokens = tokens
        self.partitions = partitions
        self.http = httpx.AsyncClient(timeout=timeout_s, trust_env=False)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        for attempt in (1, 2):
            headers = {
                "X-SLURM-USER-NAME": self.tokens.user,
                "X-SLURM-USER-TOKEN": await self.tokens.get(),
            }
            try:
                r = await self.http.request(method, self.base + path, json=body, headers=headers)
            except httpx.HTTPError as exc:
                raise SlurmUnavailable(f"slurmrestd {method} {path}: {exc}") from exc
            if r.status_code == 401 and attempt == 1:
                self.tokens.invalidate()
                continue
            break
        try:
            doc = r.json()
        except ValueError:
            doc = None
        errors = [e for e in (doc or {}).get("errors") or [] if e] if isinstance(doc, dict) else []
        if r.status_code >= 500 and not errors:
            raise SlurmUnavailable(f"slurmrestd {method} {path}: HTTP {r.status_code}")
        if r.status_code >= 400 or errors:
            detail = "; ".join(
                str(e.get("error") or e.get("description") or e) if isinstance(e, dict) else str(e)
                for e in errors
            )
            raise SlurmError(
                f"slurmrestd {method} {path}: HTTP {r.status_code}: {detail or r.text[:200]}"
            )
        return doc

    async def snapshot(self) -> Snapshot:
        jobs, nodes = await asyncio.gather(self._call("GET", "/jobs"), self._call("GET", "/nodes"))
        return Snapshot(parse_jobs(jobs, self.partitions), parse_nodes(nodes))

    async def set_nodes(self, job_id: str, nodes: list[str]) -> None:
        n = len(nodes)
        await self._call(
            "POST", f"/job/{job_id}", {"nodes": f"{n}-{n}", "nodelist": ",".join(nodes)}
        )

    async def hold(self, job_id: str) -> None:
        await self._call("POST", f"/job/{job_id}", {"hold": True})

    async def release(self, job_id: str) -> None:
        await self._call("POST", f"/job/{job_id}", {"hold": False})

    async def close(self) -> None:
        await self.http.aclose()
