"""The allocator over its HTTP API: the hall's layout, and the sync of Slurm's view for placements.

The bridge never imports the allocator (services talk over HTTP): the hall
comes from ``GET /api/v1/hall``, placements from ``POST /api/v1/cluster/sync``.
"""

from __future__ import annotations

from typing import Any

import httpx

from services.common.errors import KelvinError


class AllocatorError(KelvinError):
    """The allocator refused a request or could not be reached."""


class AllocatorClient:
    """One pooled HTTP client to the allocator."""

    def __init__(self, url: str, token: str | None, timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.AsyncClient(timeout=timeout_s, headers=headers, trust_env=False)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            r = await self.http.request(method, self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise AllocatorError(f"allocator {self.url}{path}: {exc!r}") from exc
        if r.status_code != 200:
            raise AllocatorError(f"allocator {path}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    async def hall(self) -> dict[str, Any]:
        doc: dict[str, Any] = await self._call("GET", "/api/v1/hall")
        return doc

    async def sync(self, report: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = await self._call("POST", "/api/v1/cluster/sync", report)
        return doc

    async def close(self) -> None:
        await self.http.aclose()
