"""The collect agent service: its one door (built from settings, owns its clients).

Ways in (built-in MQTT endpoint, external-broker subscription, HTTP ``/write``)
-> :class:`~.ingest.Ingestor` (decode, group commit, ack once durable)
-> :class:`~.spool.Spool` (write-ahead, on disk) -> :class:`~.writer.Writer`
-> storage. Start: storage (in the background if it is down: the spool takes
readings meanwhile), spool replay, writer, ingestor, listeners. Stop: stop
taking data (``/write`` 503, MQTT DISCONNECT 0x8B), commit and ack what was
read, close listeners, write the spool to storage for up to ``drain_timeout_s``
(retrying while storage fails; HTTP still answers meanwhile), close storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fastapi import FastAPI

from services.collect_agent import self_sensors
from services.collect_agent.ingest import Ingestor
from services.collect_agent.metrics import AgentMetrics, Rates
from services.collect_agent.mqtt_server import MqttServer
from services.collect_agent.mqtt_setup import build_endpoint
from services.collect_agent.orphans import OrphanClaimer
from services.collect_agent.routes import install as install_routes
from services.collect_agent.settings import Settings
from services.collect_agent.spool import DamageReport, Spool
from services.collect_agent.subscriber import Subscriber
from services.collect_agent.writer import Writer
from services.common.auth_settings import service_auth
from services.common.cache import SensorCache
from services.common.errors import NotFoundError
from services.common.http import HttpService, health_router, install_auth, install_error_handlers
from services.common.net import Listener
from services.common.settings import Config, LoggingSettings
from services.common.storage import StorageBackend, StorageSettings, create_storage
from services.common.tasks import stop_task, wait_for

log = logging.getLogger(__name__)


class CollectAgent(HttpService):
    """See the module docstring."""

    def __init__(
        self, config: Config, settings: Settings, storage: StorageBackend | None = None
    ) -> None:
        """``storage`` overrides the configured backend (tests wrap one to make it fail)."""
        self.settings = settings
        self.profile = config.profile
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
            settings.spool_lock_wait_s,
        )
        self.ingestor = Ingestor(self.spool, self.metrics, self.cache, settings.commit_delay_ms)
        self.spool.on_released.append(self.ingestor.check_pressure)
        self.spool.on_damage = self._count_damage
        self.storage: StorageBackend | None = storage
        self.writer: Writer | None = None
        self.mqtt: MqttServer | None = None
        self.subscriber: Subscriber | None = None
        self.claimer: OrphanClaimer | None = None
        self.rates = Rates()
        self._tasks: list[asyncio.Task[Any]] = []
        self.draining: float | None = None
        """When the drain began (monotonic s), None while taking data."""
        self.drained: dict[str, Any] | None = None
        """What the drain wrote: readings, seconds, readings_per_s, left."""
        self._scales_loaded = asyncio.Event()
        app = FastAPI(title="Kelvin collect agent", version="0.1.0")
        self.auth = service_auth(config, settings.host, "collect agent")
        install_auth(app, self.auth, self.metrics.service)
        install_error_handlers(app)
        app.include_router(health_router(self.metrics.service, self._ready))
        install_routes(app, self)
        access = config.load(LoggingSettings).access_log
        super().__init__(
            "collect-agent",
            app,
            settings.host,
            settings.port,
            "--collect-agent-port",
            access,
            self.metrics.service,
        )
        self._gauges()
        # The runner must not cut the drain short: its time plus HTTP's own shutdown.
        self.stop_timeout_s = settings.drain_timeout_s + 15.0

    def _gauges(self) -> None:
        m = self.metrics
        m.spool_bytes.set_function(lambda: self.spool.disk_bytes)
        m.spool_readings.set_function(lambda: self.spool.pending_readings)
        m.spool_records.set_function(lambda: self.spool.pending_records)
        m.spool_limit.set(self.spool.max_bytes)
        if self.cache is not None:
            cache = self.cache
            m.cache_sensors.set_function(lambda: len(cache))

    def _count_damage(self, d: DamageReport) -> None:
        kind = "incomplete" if d.incomplete else "damaged"
        self.metrics.damaged_bytes.labels(kind).inc(d.size)
        self.metrics.damaged_records.labels(kind).inc(d.records)
        self.metrics.damaged_readings.labels(kind).inc(d.readings)

    @property
    def mqtt_port(self) -> int | None:
        return self.mqtt.port if self.mqtt is not None else None

    def require_cache(self) -> SensorCache:
        if self.cache is None:
            raise NotFoundError("the sensor cache is disabled (cache_window_s: 0)")
        return self.cache

    def _ready(self) -> tuple[bool, str]:
        if self.draining is not None:
            return False, "draining: shutting down, taking no new data"
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
        every = self_sensors.interval_s(s.self_sensors_s, self.profile)
        if every > 0:
            prefix = s.self_sensors_prefix or self_sensors.default_prefix()
            own = self_sensors.run(self, prefix, every)
            self._tasks.append(asyncio.create_task(own, name="self-sensors"))
        await self._await_scales()
        if s.mqtt_enabled:
            # Kelvin's write and admin tokens log in too, in the form this agent holds
            # them (the chart gives it only sha256 verifiers).
            creds = self.auth.credentials
            self.mqtt = build_endpoint(
                s,
                self.ingestor,
                self.metrics,
                lambda: {t: r.value for t, r in creds.tokens.items()},
            )
            await self.mqtt.start()
        if s.broker is not None:
            self.subscriber = Subscriber(self.ingestor, self.metrics, s.broker)
            self._tasks.append(self.watch(self.subscriber.start()))
        if s.spool_peers_dir is not None:
            self.claimer = OrphanClaimer(
                s.spool_dir,
                s.spool_peers_dir,
                lambda: self.storage if self.writer is not None else None,
                self.metrics,
                s.orphan_scan_s,
                s.writer_batch_readings,
                s.writer_retry_max_s,
            )
            self._tasks.append(self.watch(asyncio.create_task(self.claimer.run(), name="orphans")))

    async def _await_scales(self) -> None:
        """DCDB integers are scaled on arrival: learn the stored scales before taking any."""
        with contextlib.suppress(TimeoutError):
            await wait_for(self._scales_loaded.wait(), self.settings.scales_wait_s)
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
                cap = 0.5 if self.draining is not None else self.settings.writer_retry_max_s
                delay = min(delay * 2, cap)
        self.writer = Writer(
            self.spool,
            self.storage,
            self.metrics,
            self.settings.writer_batch_readings,
            self.settings.writer_retry_max_s,
        )
        writer = self.writer.start()
        while not writer.done():
            await self._refresh_scales()
            self._scales_loaded.set()
            with contextlib.suppress(TimeoutError):
                await wait_for(asyncio.shield(writer), self.settings.metadata_refresh_s)
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

    async def stop(self) -> None:
        """SIGTERM: drain while HTTP still answers (``/write`` 503, ``/readyz`` 503), then
        stop HTTP and close."""
        if not self._stopped:
            await self.drain()
        await super().stop()

    async def drain(self, timeout_s: float | None = None) -> None:
        """Take no new data, acknowledge what was read, then keep writing the spool to
        storage for up to ``timeout_s`` (default ``drain_timeout_s``), retrying while
        storage fails. What is left stays in ``spool_dir``. Idempotent."""
        if self.draining is not None:
            return
        timeout = self.settings.drain_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        self.draining = t0
        self.ingestor.drain()  # every ingest path refuses from here (HTTP: 503, Retry-After)
        if self.claimer is not None:
            self.claimer.stopping = True  # hands a claimed orphan back within 0.2 s
        if self.mqtt is not None:
            # A few loop turns first: each connection reads what the kernel already holds
            # (sent before the drain), so it is acknowledged below rather than resent.
            for _ in range(3):
                await asyncio.sleep(0)
            # Stop reading, commit and acknowledge what was read, then let every client go
            # (MQTT 5: DISCONNECT 0x8B "server shutting down"; 3.1.1: close); pushers
            # reconnect through the Service to another agent.
            await self.mqtt.refuse_new()
        if self.subscriber is not None:
            await self.subscriber.stop()
        await self.ingestor.stop()
        if self.mqtt is not None:
            await self.mqtt.stop()  # the listener and sweeper (every client was let go above)
        pending = self.spool.pending_readings
        if pending and timeout > 0:
            log.info(
                "draining: taking no new data; writing %d spooled readings to storage "
                "for up to %g s",
                pending,
                timeout,
            )
            deadline = t0 + timeout
            while self.spool.pending_records and time.monotonic() < deadline:
                if self.writer is not None:
                    self.writer.hurry()
                empty = asyncio.ensure_future(self.spool.wait_empty())
                await asyncio.wait({empty}, timeout=min(0.2, max(0.0, deadline - time.monotonic())))
                empty.cancel()
        left = self.spool.pending_readings
        elapsed = time.monotonic() - t0
        self.drained = {
            "readings": pending - left,
            "seconds": round(elapsed, 3),
            "readings_per_s": round((pending - left) / elapsed, 1) if elapsed > 0 else 0.0,
            "left": left,
        }
        if not left:
            if pending:
                log.info(
                    "drained: %d readings written in %.2f s (%.0f readings/s); spool empty",
                    pending,
                    elapsed,
                    self.drained["readings_per_s"],
                )
        elif self.settings.spool_ephemeral:
            log.error(
                "stopping with %d readings still spooled in %s (storage: %s); the spool is "
                "ephemeral (an emptyDir): they are lost when this pod is deleted",
                left,
                self.spool.dir,
                self.writer.last_error if self.writer else "not open",
            )
        else:
            log.warning(
                "stopping with %d readings still spooled in %s (storage: %s); they stay "
                "there and are written after restart",
                left,
                self.spool.dir,
                self.writer.last_error if self.writer else "not open",
            )

    async def close(self) -> None:
        await self.drain(0)  # a start that failed: stop taking data, do not wait
        if self.writer is not None:
            await self.writer.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            await stop_task(t, what=f"collect-agent task {t.get_name()}")
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
                "damaged": [
                    {
                        "segment": d.segment,
                        "offset": d.offset,
                        "bytes": d.size,
                        "incomplete": d.incomplete,
                        "readings": d.readings,
                        "kept": str(d.kept),
                    }
                    for d in self.spool.damage
                ],
                "fsync_errors": self.spool.fsync_errors,
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
            "draining": self.draining is not None,
            "drained": self.drained,
            "connections": len(self.mqtt.conns) if self.mqtt else 0,
            "broker_connected": self.subscriber.connected if self.subscriber else None,
            "rejected": dict(sorted(self.ingestor.rejected.items())),
            "cached_sensors": len(self.cache) if self.cache is not None else 0,
        }


def create_service(config: Config) -> CollectAgent:
    return CollectAgent(config, config.load(Settings))


def listeners(config: Config) -> list[Listener]:
    """The ports ``kelvin run``/``up`` checks before anything starts."""
    s = config.load(Settings)
    found = [Listener(s.host, s.port, "collect-agent HTTP", "--collect-agent-port")]
    if s.mqtt_enabled:
        found.append(
            Listener(s.mqtt_host or s.host, s.mqtt_port, "collect-agent MQTT", "--mqtt-port")
        )
    return found
