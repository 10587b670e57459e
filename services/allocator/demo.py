"""The seeded job stream: a steady flow of short jobs so the hall changes every few seconds.

On by default under ``kelvin up --demo`` (``config.profile == "demo"``); any
deployment turns it on with ``allocator.job_stream.enabled: true``. Sizes,
runtimes and gaps come from one generator seeded with ``demo_seed``, drawn
whether or not a job is submitted, so the stream is reproducible.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from services.allocator.runtime import AllocatorCore
from services.allocator.settings import JobStream

log = logging.getLogger(__name__)


async def run_job_stream(core: AllocatorCore, cfg: JobStream, seed: int) -> None:
    rng = np.random.default_rng(seed)
    present = int(core.book.model.present.sum())
    lo, hi = min(cfg.sizes[0], present), min(cfg.sizes[1], present)
    log.info(
        "allocator: job stream on (every %.1f s on average, %d-%d nodes, %.0f-%.0f s)",
        cfg.mean_interval_s,
        lo,
        hi,
        *cfg.runtime_s,
    )
    while True:
        await asyncio.sleep(float(rng.exponential(cfg.mean_interval_s)))
        size = int(rng.integers(lo, hi + 1))
        runtime = float(rng.uniform(*cfg.runtime_s))
        if len(core.book.queue) >= cfg.max_queued:
            core.metrics.jobs.labels("stream_skipped").inc()
            continue
        core.submit(size, runtime, cfg.comm_share, stretch=True, name="demo")
