"""HTTP to ClickHouse: one connection pool per node, failover across nodes, retries.

A request goes to the node that answered last; a connection failure, a timeout
or a retryable error code (:mod:`.errors`) moves it to the next node of
``urls`` after a jittered back-off, ``retries`` times, then raises
RetryableStorageError. An INSERT whose answer never came (timeout, dropped
connection) is sent again as is: a replicated table drops the identical block
(block deduplication), and a plain table's ReplacingMergeTree collapses it,
so a retry never shows a reading twice.

Binary reads go through :mod:`.bulk` (``http.client`` in a thread) and ask
``wait_end_of_query=1``: ClickHouse otherwise streams the answer
with status 200 and appends an exception text to the body when a shard fails
part-way, which a binary decoder would take for data.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from typing import Any

import httpx

from services.common.errors import RetryableStorageError, StorageError
from services.common.storage.clickhouse import errors
from services.common.storage.clickhouse.bulk import BulkError, BulkPool
from services.common.storage.metrics import StorageMetrics
from services.common.storage.settings import ClickHouseSettings

log = logging.getLogger(__name__)
Body = bytes | Sequence[bytes | memoryview]


class ClickHouseHttp:
    """Requests to the nodes of ``settings.urls`` (see module docstring)."""

    def __init__(self, settings: ClickHouseSettings, metrics: StorageMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.urls = [u.rstrip("/") for u in settings.urls]
        self.clients: list[httpx.AsyncClient] = []
        self.bulk: list[BulkPool] = []
        self.current = 0
        self.version: tuple[int, ...] = ()
        self.version_text = ""

    async def open(self) -> None:
        s = self.settings
        headers = {"X-ClickHouse-User": s.username, "X-ClickHouse-Key": s.password}
        self.bulk = [BulkPool(u, headers, s.timeout_s, s.concurrency + 2) for u in self.urls]
        self.clients = [
            httpx.AsyncClient(
                base_url=u,
                headers=headers,
                timeout=httpx.Timeout(s.timeout_s, connect=min(5.0, s.timeout_s)),
                limits=httpx.Limits(max_connections=s.concurrency + 4),
            )
            for u in self.urls
        ]
        text = (await self.request("SELECT version()", what="bootstrap")).decode().strip()
        self.version_text = text
        self.version = tuple(int(p) for p in text.split(".") if p.isdigit())

    async def close(self) -> None:
        for c in self.clients:
            await c.aclose()
        for b in self.bulk:
            b.close()
        self.clients = []

    def where(self, i: int | None = None) -> str:
        return self.urls[self.current if i is None else i]

    async def request(
        self,
        sql: str,
        body: Body | None = None,
        settings: dict[str, Any] | None = None,
        what: str = "query",
        node: int | None = None,
    ) -> bytes | bytearray:
        """Run one statement; ``body`` is an INSERT's data (the SQL then goes in the URL).
        ``node`` pins the request to one node (no failover)."""
        if not self.clients:
            raise RetryableStorageError(f"clickhouse {self.urls[0]} is not open")
        s = self.settings
        params: dict[str, Any] = {"database": s.database} if what != "bootstrap" else {}
        params.update(settings or {})
        if body is None:
            content: bytes | list[bytes] = sql.encode()
        else:
            params["query"] = sql
            content = body if isinstance(body, bytes) else [bytes(p) for p in body]
        attempts = s.retries + 1 if node is None else 1
        last: StorageError | None = None
        for attempt in range(attempts):
            i = self.current if node is None else node
            if attempt:
                self.metrics.retries.labels("clickhouse").inc()
                delay = min(s.backoff_max_s, s.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            try:
                return await self._once(i, params, content, what)
            except RetryableStorageError as exc:
                last = exc
                if node is None and len(self.clients) > 1:
                    self.current = (i + 1) % len(self.clients)
        assert last is not None
        raise RetryableStorageError(f"{last} (after {attempts} attempt(s))") from last

    async def _once(
        self, i: int, params: dict[str, Any], content: bytes | list[bytes], what: str
    ) -> bytes | bytearray:
        body = b"".join(content) if isinstance(content, list) else content
        try:
            data: bytes | bytearray
            if what == "read":
                status, headers, data = await self.bulk[i].post(params, body)
            else:
                resp = await self.clients[i].post("/", params=params, content=body)
                status, headers = resp.status_code, dict(resp.headers)
                data = bytearray(resp.content) if status >= 300 else resp.content
        except (httpx.TimeoutException, BulkError) as exc:
            if isinstance(exc, httpx.TimeoutException) or exc.timeout:
                self.metrics.errors.labels("clickhouse", "timeout").inc()
                raise RetryableStorageError(
                    f"clickhouse {self.where(i)}: {what} timed out after {self.settings.timeout_s} "
                    f"s ({exc or type(exc).__name__}); an INSERT may have landed and is retried as is"
                ) from exc
            self.metrics.errors.labels("clickhouse", "connection").inc()
            raise RetryableStorageError(
                f"clickhouse {self.where(i)}: {what}: unreachable ({exc})"
            ) from exc
        except httpx.TransportError as exc:
            self.metrics.errors.labels("clickhouse", "connection").inc()
            raise RetryableStorageError(
                f"clickhouse {self.where(i)}: {what}: unreachable ({exc or type(exc).__name__})"
            ) from exc
        if status < 300:
            return data
        text = bytes(data).decode(errors="replace")
        lowered = {k.lower(): v for k, v in headers.items()}
        code = errors.code_of(text, lowered.get("x-clickhouse-exception-code"))
        self.metrics.errors.labels("clickhouse", f"code_{code}" if code else "http").inc()
        raise errors.error(self.where(i), what, code, status, text)

    async def query(self, sql: str, **settings: Any) -> str:
        """A statement whose (small) answer is text."""
        return (await self.request(sql, settings=settings or None)).decode()

    async def select(self, sql: str, **settings: Any) -> bytearray:
        """A SELECT whose answer is binary (:mod:`.bulk`), buffered server-side so that an
        error part-way is an error status, never data."""
        got = await self.request(sql, settings={"wait_end_of_query": 1, **settings}, what="read")
        return got if isinstance(got, bytearray) else bytearray(got)

    async def insert(self, sql: str, body: Body, **settings: Any) -> None:
        await self.request(sql, body=body, settings=settings or None, what="insert")

    async def ping(self) -> bool:
        for c in self.clients:
            try:
                if (await c.get("/ping", timeout=2.0)).status_code == 200:
                    return True
            except httpx.HTTPError:
                continue
        return False
