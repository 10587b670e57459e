"""The query API's CLI commands fail the Unix way: a message, an exit code, never a traceback.

Against a real query API (tests/query_api/conftest.py): a reader that goes away (``| head``),
a missing file, a typo'd sensor or flag, an empty time range, a redefined virtual sensor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from services.cli import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, main
from services.common.auth import Role
from services.query_api.app import create_service
from tests.query_api.conftest import T0, Api, admin_client, make_config
from tests.support.auth import TOKENS


async def test_a_reader_that_goes_away_ends_the_query_quietly(api: Api) -> None:
    """``kelvin query ... | head -1``: exit 141 (as SIGPIPE), nothing on stderr."""
    n = 200_000  # ~10 MB of CSV: far more than a pipe holds
    await api.write("/big/p", np.arange(n, dtype=np.int64) * 1e-3, np.arange(n, dtype=float))
    env = {
        **os.environ,
        "KELVIN_QUERY_API_URL": api.url,
        "KELVIN_QUERY_API_TOKEN": TOKENS[Role.READ],
    }
    cmd = [sys.executable, "-m", "services.cli", "query", "/big/p", "--start", str(T0)]

    def run() -> tuple[int, bytes, bytes]:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # what head does after its line
        err = proc.stderr.read()
        return proc.wait(timeout=60), first, err

    rc, first, err = await asyncio.to_thread(run)
    assert first.startswith(b"Sensor,Time,Value")
    assert (rc, err) == (EXIT_BROKEN_PIPE, b""), err.decode()

    def interrupted() -> tuple[int, bytes]:
        """Ctrl-C while the output streams: exit 130, no traceback."""
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        proc.stdout.read()
        return proc.wait(timeout=60), proc.stderr.read()

    rc, err = await asyncio.to_thread(interrupted)
    assert rc == EXIT_INTERRUPTED and b"Traceback" not in err, err.decode()


async def test_missing_file_typos_and_empty_ranges_are_messages(
    api: Api, kelvin, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = await kelvin("csvimport", str(tmp_path / "missing.csv"))
    assert rc == 1 and "missing.csv: No such file or directory" in err
    await api.write("/hall/row0/rack0/node0/power", [0], [1.0])
    await api.write("/hall/row0/rack0/node0/inlet_temp", [0], [20.0])
    rc, _, err = await kelvin("query", "/hall/row0/rack0/node0/powr", "--start", "now-2y")
    assert rc == 1 and "did you mean '/hall/row0/rack0/node0/power'?" in err
    rc, _, err = await kelvin("query", "/hall/row0/rak0/node0/inlet_temp", "--start", "now-90days")
    assert rc == 1 and "'/hall/row0/rack0/node0/inlet_temp'" in err
    rc, _, err = await kelvin("config", "sensor", "show", "/hall/row0/rack0/nod0/power")
    assert rc == 1 and "did you mean '/hall/row0/rack0/node0/power'?" in err
    # --end before --start: both times in ISO 8601, no raw nanoseconds
    rc, _, err = await kelvin(
        "query", "/hall/row0/rack0/node0/power", "--start", "2026-01-02", "--end", "2026-01-01"
    )
    assert rc == 1
    assert "start 2026-01-02T00:00:00Z is not before end 2026-01-01T00:00:00Z" in err
    # a typo'd flag: the subcommand's own usage and the flag it probably meant
    rc, _, err = await kelvin("query", "/x", "--satrt", "now-1h")
    assert rc == 2 and err.startswith("usage: kelvin query")
    assert "unrecognized arguments: --satrt now-1h (--satrt: did you mean --start?)" in err


async def test_redefining_a_virtual_sensor_needs_force(api: Api, kelvin) -> None:  # type: ignore[no-untyped-def]
    await api.write("/a/p", [0, 1], [1.0, 2.0], unit="W")
    define = ("config", "sensor", "virtual", "define", "/a/v")
    assert (await kelvin(*define, '"/a/p" * 2'))[0] == 0
    assert (await kelvin(*define, '"/a/p" * 2'))[0] == 0  # the same again: nothing changes
    rc, _, err = await kelvin(*define, '"/a/p" * 3')
    assert rc == 1
    assert "virtual sensor '/a/v' exists: \"/a/p\" * 2" in err and "pass --force" in err
    rc, out, _ = await kelvin(*define, '"/a/p" * 3', "--force")
    assert rc == 0 and '"/a/p" * 3' in out


async def test_redefining_a_configured_virtual_sensor_says_it_comes_back_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: the demo's /hall/pue is configured; redefining it asks for
    --force and says the next start defines it again as configured."""
    pue = {"/hall/pue": {"expression": '"/hall/total" / "/hall/it"', "unit": ""}}
    svc = create_service(make_config(tmp_path, virtual_sensors=pue, virtual_retry_s=0.05))
    await svc.start()
    try:
        async with admin_client(svc.port, timeout=30) as c:
            api = Api(svc, c)
            await api.write("/hall/total", [0, 1], [150.0, 160.0], unit="kW")
            await api.write("/hall/it", [0, 1], [100.0, 110.0], unit="kW")
            for _ in range(600):  # the configured definition, retried until its inputs exist
                shown = await c.get("/api/v1/virtual/hall/pue")
                if shown.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert shown.status_code == 200 and shown.json()["configured"] is True
            monkeypatch.setenv("KELVIN_QUERY_API_URL", api.url)
            monkeypatch.setenv("KELVIN_QUERY_API_TOKEN", TOKENS[Role.ADMIN])
            define = ["config", "sensor", "virtual", "define", "/hall/pue", '"/hall/it" * 2']
            capsys.readouterr()
            assert await asyncio.to_thread(main, define) == 1
            err = capsys.readouterr().err
            assert "virtual sensor '/hall/pue' exists" in err and "pass --force" in err
            assert "it is configured" in err and "defines it again as configured" in err
            assert await asyncio.to_thread(main, [*define, "--force"]) == 0
    finally:
        await svc.stop()
