"""The closed-loop demo: `kelvin up --demo`, then `kelvin allocator calibrate` recovers D.

One real `kelvin up --demo` (subprocess, free ports, temp data dir) at a fast
pace: the simulated hall is sampled every 100 ms and short jobs (0.5-2 s)
arrive every 0.25 s on average, placed by the `random` policy: nearly every
sample is a new occupancy, which is what a fit needs (docs/allocator.md). After a warm-up of a few hundred samples the calibration
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

FAST = """
pusher:
  plugins:
    datacenter: {interval_ms: 100}
allocator:
  job_stream: {mean_interval_s: 0.25, runtime_s: [0.5, 2.0], sizes: [1, 8]}
"""
WARMUP_SAMPLES = 380
"""Aligned operating points to collect (~40 s at 100 ms): ~10 per unknown of a row of D."""
D_REL_BOUND = 0.10
"""docs/allocator.md, "Closed loop": calibration recovers D to < 10 % (relative Frobenius) ..."""
TIN_RMSE_BOUND_C = 0.10
"""... and the predicted inlets to 0.1 °C RMS."""
NOISE_C = 0.1
"""The datacenter plugin's default inlet-sensor noise (standard deviation)."""
PROBE = "/hall/row1/rack4/node3/inlet_temp"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KelvinUp]:
    data = tmp_path_factory.mktemp("demo")
    cfg = data / "fast.yaml"
    cfg.write_text(FAST)
    up = KelvinUp(data, "--demo", "--policy", "random", "--seed", "3", config=cfg).start()
    try:
        yield up
    finally:
        rc = up.stop()
        assert rc == 0, up.tail()


def _count(client: httpx.Client, base: str, sensor: str, start_ns: int) -> int:
    r = client.get(f"{base}/api/v1/readings", params={"sensor": sensor, "start": str(start_ns)})
    return int(r.json()["count"]) if r.status_code == 200 else 0


def test_calibration_recovers_the_halls_d_from_the_demo(demo: KelvinUp, tmp_path: Path) -> None:
    query = demo.url("query_api")
    start_ns = time.time_ns() + 2 * 10**9  # skip the first placements' transient
    with httpx.Client(timeout=10) as client:
        hall = client.get(f"{demo.url('allocator')}/api/v1/hall").json()
        assert hall["policy"] == "random"  # --policy reached the allocator
        deadline = time.monotonic() + 50
        while _count(client, query, PROBE, start_ns) < WARMUP_SAMPLES:
            assert time.monotonic() < deadline, (
                f"fewer than {WARMUP_SAMPLES} readings of {PROBE} after 50 s:\n{demo.tail()}"
            )
            time.sleep(1.0)  # readings accumulate at 10 per second; nothing to await
        # The allocator's totals are stored too (what the console charts over time).
        cooling = client.get(
            f"{query}/api/v1/readings",
            params={"sensor": "/kelvin/allocator/cooling_kw", "start": str(start_ns)},
        )
        assert cooling.status_code == 200 and cooling.json()["count"] >= 1
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
    assert report["samples"] >= WARMUP_SAMPLES - 20, report
    # The residual is the sensors' noise: the stored data follow Tin = Tsup + D·P.
    assert report["rmse_c"] < 2 * NOISE_C, report
    err = report["known"]
    assert err["d_rel_frobenius"] < D_REL_BOUND, report
    assert err["tin_rmse_c"] < TIN_RMSE_BOUND_C, report
