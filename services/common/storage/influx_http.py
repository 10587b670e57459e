"""HTTP to InfluxDB: /write and /query with retries, back-off and error mapping.

Retryable (waits ``backoff_s`` doubling up to ``backoff_max_s``, with jitter,
honouring ``Retry-After``): connection failures, timeouts, 429, 500, 502,
503, 504. Permanent: other 4xx (bad line protocol, field type conflict,
unknown database, authentication). 413 (body too large) splits the request
in two. Points dropped for lying beyond the retention policy are counted,
not raised: the rest of the request is stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any

import httpx

from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.storage.metrics import StorageMetrics
from services.common.storage.settings import InfluxSettings

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


class _TooLarge(Exception):
    """HTTP 413: the caller splits the body."""


class InfluxHttp:
    """One connection pool to one InfluxDB server, database and retention policy."""

    def __init__(self, settings: InfluxSettings, metrics: StorageMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.client: httpx.AsyncClient | None = None
        self.version = ""

    async def open(self) -> None:
        s = self.settings
        headers = {"Authorization": f"Token {s.token}"} if s.token else {}
        auth = (s.username, s.password or "") if s.username and not s.token else None
        self.client = httpx.AsyncClient(
            base_url=s.url.rstrip("/"),
            headers=headers,
            auth=auth,
            timeout=s.timeout_s,
            limits=httpx.Limits(max_connections=s.concurrency + 2),
        )

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    # ------------------------------------------------------------------ requests
    async def _request(self, method: str, path: str, what: str, **kw: Any) -> httpx.Response:
        if self.client is None:
            raise RetryableStorageError(f"influxdb {self.settings.url} is not open")
        s = self.settings
        cause = ""
        for attempt in range(s.retries + 1):
            if attempt:
                self.metrics.retries.labels("influxdb").inc()
            retry_after: float | None = None
            try:
                resp = await self.client.request(method, path, **kw)
            except httpx.TimeoutException as exc:
                cause, reason = f"timed out ({type(exc).__name__})", "timeout"
            except httpx.TransportError as exc:
                cause, reason = f"unreachable ({exc or type(exc).__name__})", "connection"
            else:
                if resp.status_code < 300:
                    return resp
                if resp.status_code == 413:
                    raise _TooLarge()
                detail = _error_text(resp)
                if resp.status_code not in RETRYABLE_STATUS:
                    self.metrics.errors.labels("influxdb", f"http_{resp.status_code}").inc()
                    raise PermanentStorageError(
                        f"influxdb {s.url}: {what} rejected (HTTP {resp.status_code}): {detail}"
                        + _hint(resp.status_code)
                    )
                cause, reason = f"HTTP {resp.status_code}: {detail}", f"http_{resp.status_code}"
                retry_after = _retry_after(resp)
            self.metrics.errors.labels("influxdb", reason).inc()
            if attempt < s.retries:
                delay = min(s.backoff_max_s, s.backoff_s * 2**attempt) * random.uniform(0.5, 1.5)
                await asyncio.sleep(retry_after if retry_after is not None else delay)
        raise RetryableStorageError(
            f"influxdb {s.url}: {what} failed after {s.retries + 1} attempt(s): {cause}"
        )

    async def write(self, body: bytes, rp: str | None = None, strict: bool = False) -> None:
        """POST line protocol (ns precision) to the database and policy ``rp``.

        ``strict``: points dropped for lying beyond the policy's duration are an
        error (catalog records must never vanish) instead of a counted warning.
        """
        params = {"db": self.settings.database, "precision": "ns"}
        if rp:
            params["rp"] = rp
        try:
            await self._request("POST", "/write", "write", params=params, content=body)
        except _TooLarge:
            mid = len(body) // 2
            cut = body.rfind(b"\n", 0, mid) + 1 or body.find(b"\n", mid, len(body) - 1) + 1
            if cut <= 0:
                raise PermanentStorageError(
                    f"influxdb {self.settings.url}: one line is larger than the server's "
                    "max-body-size"
                ) from None
            await self.write(body[:cut], rp, strict)
            await self.write(body[cut:], rp, strict)
        except PermanentStorageError as exc:
            if not strict and "points beyond retention policy" in str(exc):
                self.metrics.errors.labels("influxdb", "beyond_retention").inc()
                log.warning("influxdb: %s", exc)
                return
            raise

    async def query(self, q: str, *, mutate: bool = False, db: bool = True) -> list[dict[str, Any]]:
        """Run InfluxQL; returns the ``results`` list (one per statement), errors raised."""
        params = {"q": q, "epoch": "ns"}
        if db:
            params["db"] = self.settings.database
        if mutate:
            resp = await self._request("POST", "/query", "query", data=params)
        else:
            resp = await self._request("GET", "/query", "query", params=params)
        try:
            results: list[dict[str, Any]] = resp.json().get("results", [])
        except ValueError as exc:
            raise PermanentStorageError(f"influxdb: {q[:80]!r}: not JSON: {exc}") from exc
        for r in results:
            if "error" in r:
                raise PermanentStorageError(f"influxdb: {q[:120]!r} failed: {r['error']}")
        return results

    async def query_csv(self, q: str, chunk_size: int = 100_000) -> bytes:
        """Run one SELECT and return the CSV body (chunked, so no row limit applies)."""
        params = {
            "q": q,
            "db": self.settings.database,
            "epoch": "ns",
            "chunked": "true",
            "chunk_size": str(chunk_size),
        }
        resp = await self._request(
            "GET", "/query", "read", params=params, headers={"Accept": "application/csv"}
        )
        return resp.content

    async def ping(self) -> str:
        resp = await self._request("GET", "/ping", "ping")
        self.version = resp.headers.get("X-Influxdb-Version", "")
        return self.version


def rows(results: list[dict[str, Any]]) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """Flatten query results into (tags, {column: value}) per row."""
    out = []
    for r in results:
        for series in r.get("series", []):
            tags = series.get("tags", {})
            cols = series["columns"]
            for values in series.get("values", []):
                out.append((tags, dict(zip(cols, values, strict=True))))
    return out


def _error_text(resp: httpx.Response) -> str:
    try:
        return str(json.loads(resp.content).get("error", resp.text)).strip()
    except (ValueError, AttributeError):
        return resp.text.strip()[:300]


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return min(float(resp.headers.get("Retry-After", "")), 60.0)
    except ValueError:
        return None


def _hint(status: int) -> str:
    if status in (401, 403):
        return " (check storage.influxdb.username/password or token)"
    if status == 404:
        return " (does the database exist? set storage.influxdb.create_database)"
    return ""
