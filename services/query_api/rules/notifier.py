"""Sends alerts to Alertmanager over its v2 API (``POST /api/v2/alerts``), as Prometheus does.

Alerts wait in a bounded queue (the oldest are dropped and counted when
Alertmanager is away long enough to fill it); a background task sends them in
batches to every configured Alertmanager. Firing alerts carry ``endsAt`` a few
resend periods ahead, so Alertmanager resolves them itself if Kelvin goes quiet;
resolved ones carry the time they resolved.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import httpx

from services.common.logs import RateLimitedLog
from services.common.metrics import ServiceMetrics
from services.common.tasks import stop_task

log = logging.getLogger(__name__)
_send_log = RateLimitedLog(log, 60.0)

QUEUE_CAPACITY = 10_000
BATCH = 64


class Notifier:
    def __init__(self, urls: list[str], metrics: ServiceMetrics) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.queue: deque[dict[str, Any]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client = httpx.AsyncClient(timeout=10.0)
        self.sent = metrics.counter(
            "alerts_sent_total", "Alerts sent to Alertmanager", ["alertmanager"]
        )
        self.errors = metrics.counter(
            "alert_notification_errors_total", "Failed sends to Alertmanager", ["alertmanager"]
        )
        self.dropped = metrics.counter(
            "alert_notifications_dropped_total", "Alerts dropped from a full notification queue"
        )
        self.queue_length = metrics.gauge(
            "alert_notification_queue_length", "Alerts waiting to be sent"
        )
        self.queue_length.set_function(lambda: len(self.queue))

    def start(self) -> None:
        if self.urls and self._task is None:
            self._task = asyncio.create_task(self._run(), name="alert-notifier")

    def send(self, alerts: list[dict[str, Any]]) -> None:
        if not self.urls or not alerts:
            return
        overflow = len(self.queue) + len(alerts) - QUEUE_CAPACITY
        for _ in range(max(0, overflow)):
            self.queue.popleft()
            self.dropped.inc()
        self.queue.extend(alerts)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.queue:
                batch = [self.queue.popleft() for _ in range(min(BATCH, len(self.queue)))]
                await asyncio.gather(*(self._post(url, batch) for url in self.urls))

    async def _post(self, url: str, batch: list[dict[str, Any]]) -> None:
        try:
            r = await self._client.post(f"{url}/api/v2/alerts", json=batch)
            r.raise_for_status()
            self.sent.labels(url).inc(len(batch))
        except httpx.HTTPError as exc:
            self.errors.labels(url).inc()
            _send_log.warning(url, "sending %d alert(s) to %s failed: %s", len(batch), url, exc)

    async def aclose(self) -> None:
        await stop_task(self._task, what="alert notifier")
        self._task = None
        await self._client.aclose()
