"""The writer: drains the spool into storage, in order, in large batches, never dropping.

Consecutive readings records are concatenated into one storage write of up to
``batch_readings`` readings (columnar backends want them large). A failing
storage is retried with exponential back-off for as long as it fails — the
spool grows meanwhile and the ingest side applies back-pressure at the quota.
Only a record that storage rejects *permanently* (retrying cannot help), or
that no longer decodes, is set aside: it goes to ``quarantine.wal`` in the spool
directory, counted and logged, never silently lost. A record whose bytes fail
their CRC when read back goes to the spool's ``damaged/`` directory at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from services.collect_agent import spool_format as fmt
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.spool import Entry, Item, Spool
from services.collect_agent.tasks import cancel
from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.logs import RateLimitedLog
from services.common.readings import Batch
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage.base import StorageBackend
from services.common.tasks import wait_event

log = logging.getLogger(__name__)

COALESCE_S = 0.05
"""When less than a full batch is spooled, wait this long for more before writing: a
storage write costs about the same for 1k readings as for 100k (measured 5x less CPU
per reading for the agent's SQLite writes at 1M readings/s), and readings reach
storage at most this much later."""
UNKNOWN_ERROR_ATTEMPTS = 5
"""An error that is neither retryable nor permanent is retried this often, then
treated as permanent so that one poison record cannot stall the pipeline."""


class Writer:
    """Spool -> storage (see the module docstring)."""

    def __init__(
        self,
        spool: Spool,
        storage: StorageBackend,
        metrics: AgentMetrics,
        batch_readings: int = 200_000,
        retry_max_s: float = 5.0,
    ) -> None:
        self.spool = spool
        self.storage = storage
        self.metrics = metrics
        self.batch_readings = batch_readings
        self.retry_max_s = retry_max_s
        self.readings_written = 0
        self.failing_since: float | None = None
        self.last_error: str | None = None
        self._log = RateLimitedLog(log, period_s=30.0, burst=3)
        self._task: asyncio.Task[None] | None = None
        self._retry_now = asyncio.Event()

    @property
    def quarantine_path(self) -> Path:
        return self.spool.dir / "quarantine.wal"

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self.run(), name="spool-writer")
        return self._task

    def hurry(self, retry_max_s: float = 0.5) -> None:
        """Back off at most ``retry_max_s`` from now on, and retry a failing storage now
        (the agent is draining before it exits: every second of the grace period counts)."""
        self.retry_max_s = min(self.retry_max_s, retry_max_s)
        self._retry_now.set()

    async def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Keep draining for up to the timeout (retrying a failing storage), then stop;
        what is left stays spooled for the next start."""
        if self._task is None:
            return
        if drain_timeout_s > 0 and self.spool.pending_records:
            self.hurry()
            empty = asyncio.ensure_future(self.spool.wait_empty())
            await asyncio.wait({empty, self._task}, timeout=drain_timeout_s)
            empty.cancel()
        await cancel(self._task)
        self._task = None

    async def run(self) -> None:
        backoff = 0.05
        unknown_failures = 0
        entries: list[Entry] = []
        while True:
            await self.spool.wait()
            if not entries:
                if self.spool.pending_readings < self.batch_readings:
                    await asyncio.sleep(COALESCE_S)
                # A retry sends the same records again, not more: a write whose answer was
                # lost is then an identical block, which replicated stores drop.
                entries = self.spool.peek(self.batch_readings)
            try:
                await self._store(entries, isolate=unknown_failures >= UNKNOWN_ERROR_ATTEMPTS)
            except Exception as exc:
                kind = (
                    "retryable" if isinstance(exc, RetryableStorageError | OSError) else "unknown"
                )
                if kind == "unknown":
                    unknown_failures += 1
                self.metrics.storage_errors.labels(kind).inc()
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                self._log.warning(
                    "storage",
                    "storage write failed (%s), retrying in %.2f s; %d readings spooled",
                    self.last_error,
                    backoff,
                    self.spool.pending_readings,
                )
                self._retry_now.clear()
                await wait_event(self._retry_now, backoff)
                backoff = min(backoff * 2, self.retry_max_s)
                continue
            if self.failing_since is not None:
                log.info(
                    "storage is back after %.1f s; draining %d spooled readings",
                    time.monotonic() - self.failing_since,
                    self.spool.pending_readings,
                )
            self.failing_since = None
            self.last_error = None
            backoff = 0.05
            unknown_failures = 0
            await self.spool.release(len(entries))
            entries = []

    async def _store(self, entries: list[Entry], isolate: bool) -> None:
        pending: list[Batch] = []
        for e in entries:
            if e.damaged:
                continue
            try:
                item = await self.spool.load(e)
            except fmt.CorruptRecord:
                # Its bytes on disk fail their CRC: retrying cannot help, and it must not
                # stall everything after it. Set aside (counted, logged) and go on.
                await self.spool.set_aside(e)
                continue
            except Exception as exc:  # intact but undecodable: set aside after the retries
                if not isolate or isinstance(exc, OSError):
                    raise
                body = await self.spool.read_body(e)
                self._set_aside(body, e.readings, f"spool record {e.seq} does not decode", exc)
                continue
            if isinstance(item, Batch):
                pending.append(item)
                continue
            if pending:
                await self._write(Batch.concat(pending), isolate)
                pending = []
            await self._control(item, isolate)
        if pending:
            await self._write(Batch.concat(pending), isolate)

    async def _write(self, batch: Batch, isolate: bool) -> None:
        t0 = time.perf_counter()
        try:
            await self.storage.write(batch)
        except PermanentStorageError as exc:
            await self._isolate(batch, exc)
        except (RetryableStorageError, OSError):
            raise
        except Exception as exc:
            if not isolate:
                raise
            await self._isolate(batch, exc)
        else:
            self.metrics.storage_seconds.observe(time.perf_counter() - t0)
            self.readings_written += len(batch)
            self.metrics.readings_written.inc(len(batch))

    async def _isolate(self, batch: Batch, exc: Exception) -> None:
        """Write series one by one; quarantine those storage refuses for good."""
        log.error(
            "storage refused a batch of %d readings (%s); isolating bad series", len(batch), exc
        )
        for series in batch:
            one = Batch.single(series.sensor, series.timestamps_ns, series.values)
            try:
                await self.storage.write(one)
            except (RetryableStorageError, OSError):
                raise
            except Exception as err:
                self._quarantine(one, err)
            else:
                self.readings_written += len(one)
                self.metrics.readings_written.inc(len(one))

    async def _control(self, item: Item, isolate: bool) -> None:
        try:
            if isinstance(item, SensorMetadata):
                await self.storage.put_metadata(item)
            elif isinstance(item, JobRecord):
                await self.storage.put_job(item)
        except (RetryableStorageError, OSError):
            raise
        except Exception as exc:
            if not isolate and not isinstance(exc, PermanentStorageError):
                raise
            self._quarantine(item, exc)

    def _quarantine(self, item: Item, exc: Exception) -> None:
        if isinstance(item, Batch):
            body, readings = fmt.encode_readings(item), len(item)
        elif isinstance(item, SensorMetadata):
            body, readings = fmt.encode_metadata(item), 0
        else:
            body, readings = fmt.encode_job(item), 0
        what = item.sensors[0] if isinstance(item, Batch) else type(item).__name__
        self._set_aside(body, readings, f"storage refused {what} permanently", exc)

    def _set_aside(self, body: bytes, readings: int, what: str, exc: Exception) -> None:
        with open(self.quarantine_path, "ab") as f:
            f.write(fmt.frame(0, body))
        self.metrics.quarantined.inc(readings)
        log.error("%s (%s); kept in %s", what, exc, self.quarantine_path)
