"""The closed-loop demo: `kelvin up --demo`, then `kelvin allocator calibrate` recovers D.

One real `kelvin up --demo` (subprocess, free ports, temp data dir) at its
default settings, as a user starts it: the `joint` policy places a job every
second or so, the simulated hall is sampled every 250 ms, every busy node
alternates compute and communication phases and every node's load jitters
(docs/pusher.md, `datacenter`). After a warm-up of about 75 s the calibration
command, run as a user would run it against the query API, must recover the
hall's heat-recirculation matrix within the error docs/allocator.md states.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from services.common.thermal import reference_hall
from tests.support.kelvin import KelvinUp

pytestmark = pytest.mark.slow

WARMUP_SAMPLES = 300
"""Readings of every sensor to collect: 75 s at the default 250 ms (docs/console.md's table)."""
MIN_SAMPLES = 240
"""Fewer than a minute's worth (a loaded machine skipping reads) is not the demo's default."""
DEADLINE_S = 80.0
D_REL_BOUND = 0.10
"""docs/allocator.md, "Closed loop": calibration recovers D to < 10 % (relative Frobenius) ..."""
TIN_RMSE_BOUND_C = 0.10
"""... and the predicted inlets to 0.1 °C RMS."""
NOISE_C = 0.1
"""The datacenter plugin's default inlet-sensor noise (standard deviation)."""
PROBE = "/hall/row1/rack4/node3/inlet_temp"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KelvinUp, int]]:
    up = KelvinUp(tmp_path_factory.mktemp("demo"), "--demo").start()
    try:
        yield up, time.time_ns()
    finally:
        rc = up.stop()
        assert rc == 0, up.tail()


def _count(client: httpx.Client, base: str, sensor: str, start_ns: int) -> int:
    r = client.get(f"{base}/api/v1/readings", params={"sensor": sensor, "start": str(start_ns)})
    return int(r.json()["count"]) if r.status_code == 200 else 0


def test_calibration_recovers_the_halls_d_from_the_default_demo(
    demo: tuple[KelvinUp, int], tmp_path: Path
) -> None:
    up, start_ns = demo
    query = up.url("query_api")
    with httpx.Client(timeout=10) as client:
        hall = client.get(f"{up.url('allocator')}/api/v1/hall").json()
        assert hall["policy"] == "joint"  # the default, not a test-only setting
        deadline = time.monotonic() + DEADLINE_S
        while _count(client, query, PROBE, start_ns) < WARMUP_SAMPLES:
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)  # readings accumulate at 4 per second; nothing to await
        # The allocator's totals are stored too (what the console charts over time).
        raised = client.get(
            f"{query}/api/v1/readings",
            params={"sensor": "/kelvin/allocator/supply_c", "start": str(start_ns)},
        )
        assert raised.status_code == 200 and raised.json()["count"] >= 1
        assert raised.json()["unit"] == "°C"
    known = tmp_path / "reference.D.txt"
    np.savetxt(known, reference_hall().d_matrix)
    out = subprocess.run(
        [
            sys.executable, "-m", "services.cli", "allocator", "calibrate",
            "--start", str(start_ns), "--end", "now", "--url", query,
            "--known-d", str(known), "--json",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["sensors"] == 80
    assert report["samples"] >= MIN_SAMPLES, (report, up.tail())
    # The residual is the sensors' noise: the stored data follow Tin = Tsup + D·P.
    assert report["rmse_c"] < 1.5 * NOISE_C, report
    err = report["known"]
    assert err["d_rel_frobenius"] < D_REL_BOUND, report
    assert err["tin_rmse_c"] < TIN_RMSE_BOUND_C, report
