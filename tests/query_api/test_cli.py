"""``kelvin query`` / ``config sensor`` / ``csvimport`` against a real query API."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from tests.query_api.conftest import T0, Api, S


async def kelvin(
    api: Api, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run the ``kelvin`` CLI in a subprocess against ``api`` (the event loop keeps serving)."""
    cmd = [sys.executable, "-m", "services.cli", *args]
    return await asyncio.to_thread(
        subprocess.run, cmd, input=stdin, capture_output=True, timeout=60,
        env={"KELVIN_QUERY_API_URL": api.url, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


async def test_query_prints_csv(api: Api) -> None:
    await api.write("/a/p", [0, 1], [1.0, 2.0], unit="W")
    await api.write("/b/p", [0], [5.0], unit="W")
    start, end = str(T0), str(T0 + 10 * S)
    out = await kelvin(api, "query", "/a/p", "/b/p@kW", "--start", start, "--end", end)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().splitlines() == [
        "Sensor,Time,Value",
        "/a/p,2026-05-28T20:26:40.000000000Z,1.0",
        "/a/p,2026-05-28T20:26:41.000000000Z,2.0",
        "/b/p,2026-05-28T20:26:40.000000000Z,0.005",
    ]


async def test_query_unknown_sensor_exits_1_with_message(api: Api) -> None:
    out = await kelvin(api, "query", "/no/such", "--start", "now-5m")
    assert out.returncode == 1
    assert b"/no/such" in out.stderr and b"does not exist" in out.stderr
