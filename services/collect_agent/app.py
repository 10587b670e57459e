"""The collect agent service: its one door (built from settings, owns its clients).

Ways in (built-in MQTT endpoint, external-broker subscription, HTTP ``/write``)
-> :class:`~.ingest.Ingestor` (decode, group commit, ack once durable)
-> :class:`~.spool.Spool` (write-ahead, on disk) -> :class:`~.writer.Writer`
-> storage. Start: storage (in the background if it is down: the spool takes
readings meanwhile), spool replay, writer, ingestor, listeners. Stop: stop
reading, commit and ack what was received, close listeners, drain the spool
for a while, close storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fastapi import FastAPI

from services.collect_agent.ingest import Ingestor
from services.collect_agent.metrics import AgentMetrics, Rates
from services.collect_agent.mqtt_server import MqttServer
from services.collect_agent.mqtt_setup import build_endpoint
from services.collect_agent.routes import create_router
from services.collect_agent.settings import Settings
from services.collect_agent.spool import Spool
from services.collect_agent.subscriber import Subscriber
from services.collect_agent.writer import Writer
from services.common.cache import SensorCache
from services.common.errors import NotFoundError
from services.common.http import HttpService, health_router, install_error_handlers
from services.common.settings import Config, LoggingSettings
from services.common.storage import StorageBackend, StorageSettings, create_storage

log = logging.getLogger(__name__)


class CollectAgent(HttpService):
    """See the module docstring."""

    def __init__(
        self, config: Config, settings: Settings, storage: StorageBackend | None = None
    ) -> None:
        """``storage`` overrides the configured backend (tests wrap one to make it fail)."""
        self.settings = settings
        self.storage_settings = config.load(StorageSettings)
        self.metrics = AgentMetrics()
        self.cache = (
            SensorCache(settings.cache_window_s, settings.cache_max_points)
            if settings.cache_window_s > 0
            else None
        )
        self.spool = Spool(
            settings.spool_dir,
            settings.fsync,
            settings.fsync_interval_ms,
            settings.spool_segment_bytes,
            settings.spool_max_bytes,
            settings.spool_memory_bytes,
        )
        self.ingestor = Ingestor(self.spool, self.metrics, self.cache, settings.commit_delay_ms)
        self.storage: StorageBackend | None = storage
        self.writer: Writer | None = None
        self.mqtt: MqttServer | None = None
        self.subscriber: Subscriber | None = None
        self.rates = Rates()
        self._tasks: list[asyncio.Task[Any]] = []
        self._scales_loaded = asyncio.Event()
        app = FastAPI(title="Kelvin collect agent", version="0.1.0")
        install_error_handlers(app)
        app.include_router(health_router(self.metrics.service, self._ready))
        app.include_router(create_router(self))
        access = config.load(LoggingSettings).access_log
        super().__init__(
            "collect-agent", app, settings.host, settings.port, "--collect-agent-port", access
        )
        self._gauges()

    def _gauges(self) -> None:
        m = self.metrics
        m.spool_bytes.set_function(lambda: self.spool.disk_bytes)
        m.spool_readings.set_function(lambda: self.spool.pending_readings)
        m.spool_records.set_function(lambda: self.spool.pending_records)
        m.spool_limit.set(self.spool.max_bytes)
        if self.cache is not None:
            cache = self.cache
            m.cache_sensors.set_function(lambda: len(cache))

    @property
    def mqtt_port(self) -> int | None:
        return self.mqtt.port if self.mqtt is not None else None

    def require_cache(self) -> SensorCache:
        if self.cache is None:
            raise NotFoundError("the sensor cache is disabled (cache_window_s: 0)")
        return self.cache

    def _ready(self) -> tuple[bool, str]:
        if not self.ingestor.spool_ok:
            return False, f"the spool in {self.spool.dir} refuses writes (disk full?)"
        if self.ingestor.paused:
            return False, "back-pressure: spool full, storage behind"
        return True, "ready"

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        try:
            await self._open()
        except BaseException:  # a port in use, bad TLS files: release the spool and tasks
            await self.close()
            raise

    async def _open(self) -> None:
        s = self.settings
        await self.spool.open()
        if self.spool.replayed_readings:
            self.metrics.replayed.inc(self.spool.replayed_readings)
        if self.storage is None:
            self.storage = create_storage(self.storage_settings, self.metrics.service.registry)
        self._tasks.append(self.watch(asyncio.create_task(self._storage_loop(), name="storage")))
        self._tasks.append(self.watch(self.ingestor.start()))
        self._tasks.append(asyncio.create_task(self._sample_rates(), name="rates"))
        await self._await_scales()
        if s.mqtt_enabled:
            tokens = {s.api_token: "admin"} if s.api_token else {}
            self.mqtt = build_endpoint(s, self.ingestor, self.metrics, lambda: tokens)
            await self.mqtt.start()
        if s.broker is not None:
            self.subscriber = Subscriber(self.ingestor, self.metrics, s.broker)
            self._tasks.append(self.watch(self.subscriber.start()))

    async def _await_scales(self) -> None:
        """DCDB integers are scaled on arrival: learn the stored scales before taking any."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._scales_loaded.wait(), self.settings.scales_wait_s)
        if not self._scales_loaded.is_set():
            log.warning(
                "storage did not answer within %g s: until it does, DCDB integers of sensors "
                "whose scale only storage knows are stored unscaled (a pusher's metadata "
                "announcement sets it)",
                self.settings.scales_wait_s,
            )

    async def _storage_loop(self) -> None:
        """Open storage (retrying while it is down), then run the writer and metadata refresh."""
        assert self.storage is not None
        delay = 0.1
        while True:
            try:
                await self.storage.open()
                break
            except Exception as exc:  # the spool holds readings until storage answers
                log.warning("storage not reachable (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.writer_retry_max_s)
        self.writer = Writer(
            self.spool,
            self.storage,
            self.metrics,
            self.settings.writer_batch_readings,
            self.settings.writer_retry_max_s,
            on_release=self.ingestor.check_pressure,
        )
        writer = self.writer.start()
        while not writer.done():
            await self._refresh_scales()
            self._scales_loaded.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(writer), self.settings.metadata_refresh_s)
        await writer

    async def _refresh_scales(self) -> None:
        assert self.storage is not None
        try:
            metas = await self.storage.list_metadata("/")
        except Exception as exc:
            log.debug("metadata refresh failed: %s", exc)
            return
        for m in metas:
            if m.scale != 1.0 or m.name in self.ingestor.scales:
                self.ingestor.scales[m.name] = m.scale

    async def _sample_rates(self) -> None:
        while True:
            w = self.writer.readings_written if self.writer else 0
            self.rates.sample(self.ingestor.readings_spooled, w)
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        if self.mqtt is not None:
            await self.mqtt.refuse_new()  # what was read is committed and acked, then 0x8B
        if self.subscriber is not None:
            await self.subscriber.stop()
        await self.ingestor.stop()
        if self.mqtt is not None:
            await self.mqtt.stop()
        if self.writer is not None:
            await self.writer.stop(self.settings.drain_timeout_s)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        await self.spool.close()
        if self.storage is not None:
            with contextlib.suppress(Exception):
                await self.storage.close()

    # ------------------------------------------------------------------ statistics
    def stats(self) -> dict[str, Any]:
        received, written = self.rates.rates()
        w = self.writer
        return {
            "readings_per_s": round(received, 1),
            "written_per_s": round(written, 1),
            "readings_spooled": self.ingestor.readings_spooled,
            "readings_written": w.readings_written if w else 0,
            "spool": {
                "bytes": self.spool.disk_bytes,
                "limit_bytes": self.spool.max_bytes,
                "pending_readings": self.spool.pending_readings,
                "pending_records": self.spool.pending_records,
                "replayed_readings": self.spool.replayed_readings,
                "fsync": self.spool.fsync,
            },
            "storage": {
                "backend": self.storage_settings.backend,
                "open": w is not None,
                "failing_for_s": None
                if w is None or w.failing_since is None
                else round(time.monotonic() - w.failing_since, 1),
                "last_error": w.last_error if w else None,
            },
            "backpressure": self.ingestor.paused,
            "connections": len(self.mqtt.conns) if self.mqtt else 0,
            "broker_connected": self.subscriber.connected if self.subscriber else None,
            "rejected": dict(sorted(self.ingestor.rejected.items())),
            "cached_sensors": len(self.cache) if self.cache is not None else 0,
        }


def create_service(config: Config) -> CollectAgent:
    return CollectAgent(config, config.load(Settings))
