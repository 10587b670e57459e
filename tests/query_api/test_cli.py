"""``kelvin query`` / ``config sensor`` / ``csvimport`` against a real query API."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np

from services.common.auth import Role
from tests.query_api.conftest import T0, Api, S
from tests.support.auth import TOKENS


async def kelvin_process(api: Api, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the ``kelvin`` entry point in a subprocess (the event loop keeps serving)."""
    cmd = [sys.executable, "-m", "services.cli", *args]
    return await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, timeout=60,
        env={"KELVIN_QUERY_API_URL": api.url, "KELVIN_QUERY_API_TOKEN": TOKENS[Role.ADMIN],
             "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


async def test_query_prints_csv(api: Api) -> None:
    await api.write("/a/p", [0, 1], [1.0, 2.0], unit="W")
    await api.write("/b/p", [0], [5.0], unit="W")
    start, end = str(T0), str(T0 + 10 * S)
    out = await kelvin_process(api, "query", "/a/p", "/b/p@kW", "--start", start, "--end", end)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().splitlines() == [
        "Sensor,Time,Value",
        "/a/p,2026-05-28T20:26:40.000000000Z,1.0",
        "/a/p,2026-05-28T20:26:41.000000000Z,2.0",
        "/b/p,2026-05-28T20:26:40.000000000Z,0.005",
    ]


async def test_query_operations_raw_times_and_unknown_sensor(api: Api, kelvin) -> None:  # type: ignore[no-untyped-def]
    await api.write("/a/e", [0, 2], [100.0, 160.0], unit="J")
    rc, out, _ = await kelvin(
        "query", "derivative(/a/e)", "--start", str(T0), "--end", str(T0 + 5 * S), "--raw"
    )
    assert rc == 0 and out.splitlines() == ["Sensor,Time,Derivative", f"/a/e,{T0 + 2 * S},30.0"]
    rc, _, err = await kelvin("query", "/no/such", "--start", "now-5m")
    assert rc == 1 and "/no/such" in err and "does not exist" in err


async def test_config_sensor_metadata(api: Api, kelvin) -> None:  # type: ignore[no-untyped-def]
    await api.write("/a/p", [0], [1.0])
    assert (await kelvin("config", "sensor", "unit", "/a/p", "kW"))[0] == 0
    assert (await kelvin("config", "sensor", "scale", "/a/p", "0.001"))[0] == 0
    assert (await kelvin("config", "sensor", "ttl", "/a/p", "30d"))[0] == 0
    assert (await kelvin("config", "sensor", "interval", "/a/p", "500ms"))[0] == 0
    assert (await kelvin("config", "sensor", "property", "/a/p", "monotonic", "on"))[0] == 0
    rc, out, _ = await kelvin("config", "sensor", "show", "/a/p")
    assert rc == 0
    assert "Unit:           kW" in out and "Scaling factor: 0.001" in out
    assert "TTL:            2592000000 ms" in out and "Interval:       500 ms" in out
    assert (
        "Properties:     monotonic" in out and "Newest reading: 1.0 at 2026-05-28T20:26:40" in out
    )
    meta = await api.storage.get_metadata("/a/p")
    assert meta is not None and meta.unit == "kW" and meta.ttl_ms == 30 * 86_400_000
    rc, out, _ = await kelvin("config", "sensor", "list", "/a")
    assert rc == 0 and out.split() == ["/a/p"]
    rc, _, err = await kelvin("config", "sensor", "ttl", "/a/p", "forever-ish")
    assert rc == 2 and "ttl" in err


async def test_config_sensor_virtual(api: Api, kelvin) -> None:  # type: ignore[no-untyped-def]
    await api.write("/a/p", [0, 1], [100.0, 200.0], unit="W")
    await api.write("/b/p", [0, 1], [1.0, 2.0], unit="kW")
    rc, out, _ = await kelvin(
        "config",
        "sensor",
        "virtual",
        "define",
        "/v/total",
        '"/a/p" + "/b/p"',
        "--unit",
        "kW",
        "--interval",
        "1s",
    )
    assert rc == 0 and "Unit:           kW" in out and "Interval:       1000 ms (declared)" in out
    rc, out, _ = await kelvin("config", "sensor", "virtual", "list")
    assert out.strip() == '/v/total [kW] = "/a/p" + "/b/p"'
    rc, out, _ = await kelvin("query", "/v/total", "--start", str(T0), "--end", str(T0 + 2 * S))
    assert out.splitlines()[1:] == [
        "/v/total,2026-05-28T20:26:40.000000000Z,1.1",
        "/v/total,2026-05-28T20:26:41.000000000Z,2.2",
    ]
    rc, _, err = await kelvin("config", "sensor", "virtual", "define", "/v/bad", '"/a/p" + 3 degC')
    assert rc == 1 and "at position 8" in err and "^" in err
    assert (await kelvin("config", "sensor", "virtual", "delete", "/v/total"))[0] == 0
    rc, _, err = await kelvin("config", "sensor", "virtual", "show", "/v/total")
    assert rc == 1 and "does not exist" in err


async def test_csvimport_round_trips_with_query(api: Api, kelvin, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    ts = np.cumsum(rng.integers(1, 10**9, 500))
    vals = rng.normal(100, 30, 500)
    vals[17] = np.nan
    await api.write("/src/a", ts / S, vals)
    await api.write("/src/b", ts[:50] / S, vals[:50] * 1e-9)
    window = ["--start", str(T0), "--end", str(T0 + int(ts[-1]) + 1)]
    rc, exported, _ = await kelvin("query", "/src/a", "/src/b", *window)
    assert rc == 0
    f = tmp_path / "export.csv"
    f.write_text(exported)
    rc, _, err = await kelvin("csvimport", str(f), "--prefix", "/copy", "--chunk-lines", "120")
    assert rc == 0 and "imported 550 readings" in err
    rc, again, _ = await kelvin("query", "/copy/src/a", "/copy/src/b", *window)
    assert again == exported.replace("/src/", "/copy/src/")  # the same digits, NaN kept as empty


async def test_csvimport_wide_layout_and_bad_rows(api: Api, kelvin, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "wide.csv"
    f.write_text("Time,/w/x,/w/y\n2026-05-28T20:26:40Z,1.5,\n2026-05-28 20:26:41,2.5,7\n")
    rc, _, err = await kelvin("csvimport", str(f))
    assert rc == 0 and "imported 3 readings" in err
    x = await api.storage.read("/w/x", 0, 2**62)
    y = await api.storage.read("/w/y", 0, 2**62)
    assert x.values.tolist() == [1.5, 2.5] and y.timestamps_ns.tolist() == [T0 + S]
    bad = tmp_path / "bad.csv"
    bad.write_text("Sensor,Time,Value\n/w/z,now,1\n/w/z,2026-05-28T20:26:41Z,abc\n")
    rc, _, err = await kelvin("csvimport", str(bad))
    assert rc == 1 and "line 3" in err and "'abc' is not a number" in err
    assert not await api.storage.has_sensor("/w/z")  # nothing half-written
    rows = [f"/w/c,2026-05-28T20:26:4{k}Z,{k}" for k in range(5)]
    rows[3] = "/w/c,2026-05-28T20:26:43Z,oops"  # file line 5, line 3 of the second chunk
    bad.write_text("Sensor,Time,Value\n" + "\n".join(rows) + "\n")
    rc, _, err = await kelvin("csvimport", str(bad), "--chunk-lines", "2")
    assert rc == 1 and "line 5: value 'oops' is not a number" in err, err
    assert "the chunk from line 4 was not imported; 2 readings before it were" in err
    assert (await api.storage.read("/w/c", 0, 2**62)).values.tolist() == [0.0, 1.0]
