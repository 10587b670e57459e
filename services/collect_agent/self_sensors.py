"""The collect agent's own rates as sensors: their history is stored like any other reading.

Every ``self_sensors_s`` the agent takes what ``GET /api/v1/stats`` reports now
and hands it to its own ingestor as readings of
``<prefix>/readings_per_s``, ``written_per_s``, ``spool_pending_readings``,
``rejected_total`` and ``connections`` (prefix
``/kelvin/collect_agent/<short hostname>``: one set per agent when several
share a storage). They go through the spool like pushed readings (durable,
nothing lost while storage is away); their units are stored once storage is
open. The console's ingest view charts them, so its history survives a reload.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from services.collect_agent.ingest import Draining
from services.common.readings import Batch
from services.common.sensors import SensorMetadata

log = logging.getLogger(__name__)

QUANTITIES: dict[str, tuple[str, Callable[[dict[str, Any]], float]]] = {
    "readings_per_s": ("1/s", lambda st: st["readings_per_s"]),
    "written_per_s": ("1/s", lambda st: st["written_per_s"]),
    "spool_pending_readings": ("", lambda st: st["spool"]["pending_readings"]),
    "rejected_total": ("", lambda st: sum(st["rejected"].values())),
    "connections": ("", lambda st: st["connections"]),
}
"""Sensor -> (unit, its value in the stats document)."""


UP_INTERVAL_S = 5.0
"""Under ``kelvin up`` (profiles ``up``/``demo``), unless configured."""


def interval_s(configured: float | None, profile: str) -> float:
    """How often to store the own sensors (0 = not at all)."""
    if configured is not None:
        return configured
    return UP_INTERVAL_S if profile in ("up", "demo") else 0.0


def default_prefix() -> str:
    return f"/kelvin/collect_agent/{socket.gethostname().split('.', 1)[0] or 'agent'}"


def batch_of(stats: dict[str, Any], prefix: str, now_ns: int) -> Batch:
    """One reading of every quantity at ``now_ns``."""
    names = [f"{prefix}/{q}" for q in QUANTITIES]
    values = np.array([float(get(stats)) for _, get in QUANTITIES.values()])
    return Batch(
        names,
        np.arange(len(names) + 1, dtype=np.int64),
        np.full(len(names), now_ns, dtype=np.int64),
        values,
    )


async def run(agent: Any, prefix: str, every_s: float) -> None:
    """Hand the agent's stats to its ingestor every ``every_s`` until it drains."""
    described = False
    while True:
        await asyncio.sleep(every_s)
        try:
            await agent.ingestor.receive_batch(
                batch_of(agent.stats(), prefix, time.time_ns()), 0, "self"
            )
        except Draining:
            return
        except Exception as exc:  # a spool refusing writes: try again next time, never die
            log.warning("collect agent: own sensors not stored: %s", exc)
            continue
        if not described and agent.writer is not None and agent.storage is not None:
            try:
                for q, (unit, _) in QUANTITIES.items():
                    await agent.storage.put_metadata(
                        SensorMetadata(
                            name=f"{prefix}/{q}",
                            unit=unit or None,
                            interval_ms=round(every_s * 1000),
                        )
                    )
                described = True
            except Exception as exc:  # storage away: the next round tries again
                log.debug("collect agent: own sensors' metadata not stored yet: %s", exc)
