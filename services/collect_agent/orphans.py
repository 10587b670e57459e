"""Spools that outlived their agent (a scale-down, a deleted pod): claimed and drained.

Agents whose spool directories sit side by side on one shared volume
(``spool_peers_dir``, e.g. a ReadWriteMany claim with one directory per pod) look
at their siblings every ``orphan_scan_s``. A sibling with segments whose lock
nobody holds belongs to an agent that is gone; the first agent to take its lock
replays it and writes it to storage like its own spool (in order, idempotent, so
a record written twice is stored once). If the owner comes back meanwhile, it
asks for its directory (:data:`~.spool.WANTED`, kept fresh while it waits) and the
claimer hands it back at once: nothing is written by two agents at a time, and the owner replays what is
left. ``kelvin spool drain DIR`` does the same for one directory and exits (the
chart's drain Job for a removed ordinal's volume).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.spool import Spool, SpoolError, is_wanted
from services.collect_agent.writer import Writer
from services.common.storage.base import StorageBackend

log = logging.getLogger(__name__)


def has_segments(directory: Path) -> bool:
    return any(directory.glob("spool-*.wal"))


async def drain_dir(
    directory: Path,
    storage: StorageBackend,
    metrics: AgentMetrics,
    batch_readings: int = 200_000,
    retry_max_s: float = 5.0,
    give_up: Callable[[], bool] | None = None,
) -> tuple[int, int] | None:
    """Claim ``directory`` and write its spool to storage until it is empty, its owner
    wants it back, or ``give_up()``: (readings written, readings left), or None when
    another process holds it."""
    spool = Spool(directory, memory_bytes=0)
    try:
        await spool.open()
    except SpoolError:
        return None  # its agent (or another claimer) holds it
    writer = Writer(spool, storage, metrics, batch_readings, retry_max_s)
    pending = spool.pending_readings
    try:
        if pending:
            log.warning(
                "claimed the spool %s that no agent holds: draining %d readings",
                directory,
                pending,
            )
            writer.start()
            while spool.pending_records:
                if is_wanted(directory) or (give_up is not None and give_up()):
                    break
                empty = asyncio.ensure_future(spool.wait_empty())
                await asyncio.wait({empty}, timeout=0.2)
                empty.cancel()
    finally:
        await writer.stop()
        left = spool.pending_readings
        await spool.close()
    written = pending - left
    metrics.orphan_readings.inc(written)
    if pending:
        if left:
            log.warning(
                "handed the spool %s back with %d readings left (%d written)",
                directory,
                left,
                written,
            )
        else:
            log.info("drained the orphaned spool %s: %d readings written", directory, written)
    return written, left


class OrphanClaimer:
    """Every ``scan_s``, drain sibling spools under ``peers`` that no agent holds."""

    def __init__(
        self,
        own: Path,
        peers: Path,
        storage: Callable[[], StorageBackend | None],
        metrics: AgentMetrics,
        scan_s: float,
        batch_readings: int,
        retry_max_s: float,
    ) -> None:
        self.own = own.resolve()
        self.peers = peers
        self.storage = storage
        self.metrics = metrics
        self.scan_s = scan_s
        self.batch_readings = batch_readings
        self.retry_max_s = retry_max_s
        self.stopping = False

    async def run(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.scan_s)
            storage = self.storage()
            if storage is None:
                continue  # storage not open: nothing could be drained
            for d in await asyncio.to_thread(self._candidates):
                if self.stopping:
                    break
                await drain_dir(
                    d,
                    storage,
                    self.metrics,
                    self.batch_readings,
                    self.retry_max_s,
                    give_up=lambda: self.stopping,
                )

    def _candidates(self) -> list[Path]:
        try:
            dirs = sorted(p for p in self.peers.iterdir() if p.is_dir())
        except OSError as exc:
            log.warning("cannot list the spool peers directory %s: %s", self.peers, exc)
            return []
        return [d for d in dirs if d.resolve() != self.own and not is_wanted(d) and has_segments(d)]
