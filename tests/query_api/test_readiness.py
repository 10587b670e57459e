"""``/readyz`` tells the truth about storage: a real influxd stopped and started under a
running query API, and a query API started while influxd is down (it serves, not ready,
instead of exiting into a crash loop)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from services.common.settings import Config
from services.query_api.app import create_service
from tests.support.influxdb import InfluxDB


async def ready_becomes(client: httpx.AsyncClient, want: bool, timeout_s: float = 20) -> str:
    """Poll ``/readyz`` (the state of another process has no event to await)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = await client.get("/readyz")
        if (r.status_code == 200) == want:
            return str(r.json()["reason"])
        assert time.monotonic() < deadline, f"/readyz still {r.status_code}: {r.text}"
        await asyncio.sleep(0.05)


async def test_readyz_follows_a_real_influxd_down_at_start_stopped_and_restarted(
    tmp_path: Path,
) -> None:
    server = InfluxDB(tmp_path)  # not started yet: down when the query API starts
    influx = server.settings("kelvin_ready", retries=0, timeout_s=1).model_dump(mode="json")
    config = Config(
        overrides={
            "query_api": {"host": "127.0.0.1", "port": 0, "storage_check_s": 0.1},
            "storage": {"backend": "influxdb", "influxdb": influx},
        }
    )
    svc = create_service(config)
    await svc.start()  # does not raise: it serves and says it is not ready
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}", timeout=10) as c:
            reason = await ready_becomes(c, False)
            assert "not reachable" in reason
            assert (await c.get("/api/v1/sensors")).status_code == 503
            server.start()
            assert await ready_becomes(c, True) == "ready, storage answers"
            assert (await c.get("/api/v1/sensors")).status_code == 200
            server.stop()  # a real outage under a running query API
            assert "does not answer" in await ready_becomes(c, False)
            assert (await c.get("/api/v1/sensors")).status_code == 503
            server.start()  # same port and data directory
            await ready_becomes(c, True)
            assert (await c.get("/api/v1/sensors")).status_code == 200
    finally:
        await svc.stop()
        server.stop()
