"""Per-job accounting on the closed loop: sbatch jobs heat the simulated hall, the pusher measures
it, and a job's energy is the integral of its nodes' stored power over its time."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from typing import Any

import numpy as np

from services import cli
from services.common.hall_physics import Physics
from services.common.thermal import reference_hall
from tests.slurm_bridge.conftest import Stack

NS = 1_000_000_000


def _readings(
    stack: Stack, sensor: str, start_ns: int, end_ns: int
) -> tuple[np.ndarray, np.ndarray]:
    r = stack.query.get(
        "/api/v1/readings", params={"sensor": sensor, "start": str(start_ns), "end": str(end_ns)}
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    values = np.array([np.nan if v is None else v for v in doc["values"]], dtype=float)
    return np.asarray(doc["timestamps_ns"], dtype=np.int64), values


def _stored(stack: Stack, job_id: str) -> dict[str, Any] | None:
    r = stack.query.get(f"/api/v1/jobs/{job_id}")
    if r.status_code != 200:
        return None
    doc: dict[str, Any] = r.json()
    return doc if doc["complete"] else None  # ended, and readings after its end are stored


def test_a_jobs_energy_is_the_integral_of_its_nodes_stored_power(stack: Stack) -> None:
    stack.idle()
    c = stack.cluster
    kelvin = [c.sbatch(n, "--comment=kelvin:comm=0.2", seconds=2) for n in (3, 2)]
    direct = c.sbatch(2, "-p", "direct", seconds=2)
    stack.wait_done([*kelvin, direct])
    docs = {
        j: c.wait(lambda j=j: _stored(stack, j), 20, f"job {j} stored") for j in [*kelvin, direct]
    }
    hall = reference_hall()
    for doc in docs.values():
        start, end = doc["start_ns"], doc["end_ns"]
        assert 1.5 < doc["duration_s"] < 4.0
        assert doc["nodes"] and not doc["missing_sensors"]
        # independently: each node's stored readings, linear between them, integrated on a fine grid
        total = 0.0
        peak = -np.inf
        for node in doc["nodes"]:
            ts, vs = _readings(stack, f"{node}/power", start - 30 * NS, end + 30 * NS)
            grid = np.linspace(start, end, 40_001)
            total += float(np.trapezoid(np.interp(grid, ts, vs), grid / NS))
            _, ivs = _readings(stack, f"{node}/inlet_temp", start, end + 1)
            peak = max(peak, float(np.nanmax(ivs)))
        assert abs(doc["it_energy_j"] - total) <= 1e-4 * total
        per_node_w = doc["avg_power_w"] / len(doc["nodes"])
        assert 2000 < per_node_w < 3700, per_node_w  # busy, not idle (1000 W)
        assert doc["peak_inlet_c"] == peak
        # cooling is IT energy over the CRAC's CoP at the raised supply, which lies between
        # the CoP of the hall's coldest and hottest possible supply; the simulated CRAC lowers
        # its supply down to supply_min_c under load, so an idle hall's inlets can be that cold
        # for a while (it warms its air back at 3 °C/min): Tsup' reaches Tsup + Tred - 12 °C
        ratio = doc["cooling_energy_j"] / doc["it_energy_j"]
        hottest = hall.supply_c + hall.redline_c - Physics().supply_min_c
        assert 1 / hall.cop(hottest) < ratio < 1 / hall.cop(0.0)
    assert {docs[j]["policy"] for j in kelvin} == {"joint"} and docs[direct]["policy"] == "slurm"
    # `kelvin jobs report` lists them with the policy that placed each
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli.main(
            ["jobs", "report", "--since", "now-10m", "--url", stack.up.url("query_api"), "--json"]
        )
    assert rc == 0
    listed = {j["job_id"]: j["policy"] for j in json.loads(out.getvalue())["jobs"]}
    assert all(listed[j] == docs[j]["policy"] for j in docs)
