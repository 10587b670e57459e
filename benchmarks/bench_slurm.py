"""Kelvin placing a real Slurm's jobs, against Slurm placing them itself, on the same cluster.

One Slurm from Debian's packages on loopback (tests/support/slurm.py: the
reference hall's 40 nodes, ``--quick``: 12), ``kelvin up`` with the allocator
following it and the simulated hall measured by the pusher, and the bridge.
Slurm alone is the ``direct`` partition over the same nodes (not held, Slurm's
select/linear picks the nodes); Kelvin is the ``kelvin`` partition (held by
the shipped job_submit.lua, placed by the allocator, released by the bridge).

1. Submit-to-start latency on an idle cluster: one 2-node job at a time; the
   job script writes its own start time (ns), the submit time is taken just
   before ``sbatch``.
2. Placements per second: a burst of 1-node jobs that exit at once, first
   submission to last start.
3. Cooling energy: one seeded job stream (Poisson arrivals, 2-8 nodes, 3-8 s)
   placed by each policy and by Slurm; the pusher's ``/hall/cooling_power``
   and ``/hall/power`` (the simulated CRAC at the raised supply, Tsup' from
   the hottest inlet) integrated over the same window for every run.
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from services.common.halls.hallfile import save_hall
from services.common.thermal import reference_hall

NS = 1_000_000_000
POLICIES = ("joint", "mpit", "mc1x1", "first-fit", "random")


def _hall(work: Path, nodes: int) -> Path:
    hall = reference_hall()
    if nodes < hall.n_nodes:
        present = np.zeros(hall.n_nodes, dtype=bool)
        present[:nodes] = True
        hall = hall.replace(present=present, name=f"reference-{nodes}")
    return save_hall(hall, work / "hall.yaml")


class Loop:
    """The cluster, ``kelvin up`` and the bridge, with the stream helpers."""

    def __init__(self, nodes: int) -> None:
        from tests.support.slurm import SlurmCluster

        self.work = Path(tempfile.mkdtemp(prefix="kelvin-bench-slurm-"))
        os.chmod(self.work, 0o777)  # job scripts (as root) write their start times here
        self.cluster = SlurmCluster(nodes)
        try:
            self._start(nodes)
        except BaseException:
            self.close()
            raise

    def _start(self, nodes: int) -> None:
        from tests.support.kelvin import KelvinUp
        from tests.support.servers import free_port
        from tests.support.slurm import Bridge

        self.cluster.start()
        hall = str(_hall(self.work, nodes))
        conf = self.work / "kelvin.yaml"
        conf.write_text(
            yaml.safe_dump(
                {
                    "allocator": {"cluster": "external", "hall_file": hall, "policy": "joint"},
                    "pusher": {"plugins": {"datacenter": {"hall_file": hall, "seed": 1}}},
                    "query_api": {"jobs": {"hall_file": hall}},
                }
            )
        )
        self.up = KelvinUp(self.work, config=conf).start()
        token = self.work / "notify.token"
        secret = secrets.token_urlsafe(16)
        token.write_text(secret)
        wake = free_port()
        self.bridge = Bridge(
            self.work,
            {
                "host": "127.0.0.1",
                "port": free_port(),
                "wake_port": wake,
                "allocator_url": self.up.url("allocator"),
                "slurmrestd_url": self.cluster.rest_url,
                "jwt_user": "root",
                "jwt_key_file": str(self.cluster.jwt_key),
                "node_names": f"n[01-{nodes:02d}]",
                "poll_interval_s": 1.0,
                "notify_token": secret,
            },
            auth={"token_file": str(self.work / "auth" / "tokens.json")},
        )
        self.cluster.notify_conf(self.bridge.url, token, wake)
        self.bridge.start()
        self.allocator = httpx.Client(base_url=self.up.url("allocator"), timeout=30)
        self.query = httpx.Client(base_url=self.up.url("query_api"), timeout=60)

    def close(self) -> None:
        """Stop whatever of it started."""
        for part in ("bridge", "up", "cluster"):
            if hasattr(self, part):
                getattr(self, part).stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def submit(self, nodes: int, seconds: float, kelvin: bool) -> tuple[str, int]:
        """(job id, submit time ns); the job writes its start time to ``start.<id>``."""
        part = [] if kelvin else ["-p", "direct"]
        script = f"date +%s%N > {self.work}/start.$SLURM_JOB_ID; sleep {seconds}"
        t = time.time_ns()
        out = self.cluster.run(
            "sbatch", "--parsable", "-N", str(nodes), "-o", "/dev/null", "-D", "/tmp",
            *part, "--wrap", script,
        )  # fmt: skip
        return out.strip().split(";")[0], t

    def started_ns(self, job_id: str) -> int | None:
        path = self.work / f"start.{job_id}"
        text = path.read_text().strip() if path.exists() else ""
        return int(text) if text else None

    def wait_done(self, ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        active = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING"}

        def done() -> dict[str, dict[str, Any]] | None:
            jobs = self.cluster.jobs()
            return None if any(jobs[i]["job_state"] in active for i in ids) else jobs

        found: dict[str, dict[str, Any]] = self.cluster.wait(done, timeout, "stream done", 0.1)
        return found

    def idle(self) -> None:
        self.cluster.cancel_all()

    def integral(self, sensor: str, start_ns: int, end_ns: int) -> float:
        r = self.query.get(
            "/api/v1/readings",
            params={"sensor": sensor, "start": str(start_ns), "end": str(end_ns)},
        )
        r.raise_for_status()
        doc = r.json()
        ts = np.asarray(doc["timestamps_ns"], dtype=np.float64)
        vs = np.asarray([np.nan if v is None else v for v in doc["values"]], dtype=np.float64)
        ok = ~np.isnan(vs)
        return float(np.trapezoid(vs[ok], ts[ok] / NS)) if ok.sum() > 1 else float("nan")


def _latency(loop: Loop, count: int) -> list[str]:
    rows = {}
    for kelvin in (False, True):
        loop.idle()
        waits = []
        for _ in range(count):
            job, t = loop.submit(2, 0.2, kelvin)
            loop.wait_done([job], 30)
            started = loop.started_ns(job)
            assert started is not None, f"job {job} left no start time"
            waits.append((started - t) / 1e6)
        rows[kelvin] = waits
    base = statistics.median(rows[False])
    out = []
    for kelvin in (False, True):
        w = rows[kelvin]
        p95 = float(np.percentile(w, 95))
        out.append(
            f"| {'Kelvin (held, placed, released)' if kelvin else 'Slurm alone'} | {len(w)} | "
            f"{statistics.median(w):.0f} | {p95:.0f} | {max(w):.0f} | "
            f"{statistics.median(w) - base:+.0f} |"
        )
    return out


def _throughput(loop: Loop, count: int) -> list[str]:
    out = []
    for kelvin in (False, True):
        loop.idle()
        first = time.time_ns()
        ids = [loop.submit(1, 0, kelvin)[0] for _ in range(count)]
        loop.wait_done(ids, 300)
        starts = [s for s in (loop.started_ns(i) for i in ids) if s is not None]
        span = (max(starts) - first) / NS
        out.append(
            f"| {'Kelvin' if kelvin else 'Slurm alone'} | {count} | {len(starts)} | {span:.1f} | "
            f"{len(starts) / span:.1f} |"
        )
    return out


def _stream(seed: int, count: int, nodes: int) -> list[tuple[float, int, float]]:
    """(gap before it s, size, runtime s), seeded."""
    rng = np.random.default_rng(seed)
    hi = min(8, nodes // 2)
    return [
        (float(rng.exponential(1.5)), int(rng.integers(2, hi + 1)), float(rng.uniform(3, 8)))
        for _ in range(count)
    ]


def _cooling(loop: Loop, count: int, nodes: int, policies: tuple[str, ...]) -> list[str]:
    stream = _stream(14, count, nodes)
    runs = []
    for who in (*policies, "slurm"):
        loop.idle()
        if who != "slurm":
            loop.allocator.put(
                "/api/v1/policy", json={"policy": who}, headers=loop.up.headers()
            ).raise_for_status()
        time.sleep(3)  # the hall back at idle power in the stored readings
        t0 = time.time_ns()
        ids, submitted = [], {}
        for gap, size, runtime in stream:
            time.sleep(gap)
            job, t = loop.submit(size, round(runtime, 1), who != "slurm")
            ids.append(job)
            submitted[job] = t
        jobs = loop.wait_done(ids, 600)
        end = max(j["end_time"] for j in (jobs[i] for i in ids)) * NS
        waits = [(loop.started_ns(i) or t0) - submitted[i] for i in ids]
        runs.append((who, t0, end, float(np.mean(waits)) / NS))
    window = max(end - t0 for _, t0, end, _ in runs) + 2 * NS
    time.sleep(3)  # the last readings stored
    rows = []
    base = None
    for who, t0, end, wait in runs:
        cooling = loop.integral("/hall/cooling_power", t0, t0 + window) / 3.6e3
        it = loop.integral("/hall/power", t0, t0 + window) / 3.6e3
        if who == "slurm":
            base = cooling
        rows.append((who, cooling, it, (end - t0) / NS, wait))
    assert base is not None
    return [
        f"| {who} | {cooling:.2f} | {it:.2f} | {cooling / it:.3f} | {cooling / base - 1:+.1%} | "
        f"{makespan:.0f} | {wait:.1f} |"
        for who, cooling, it, makespan, wait in rows
    ] + [f"\n(window {window / NS:.0f} s from each stream's first submission)"]


def main(quick: bool) -> str:
    import pytest

    nodes = 12 if quick else 40
    try:
        loop = Loop(nodes)
    except pytest.skip.Exception as exc:  # Slurm's packages are missing here
        return f"skipped: {exc} (scripts/install-peers.sh installs them)"
    try:
        latency = _latency(loop, 5 if quick else 20)
        throughput = _throughput(loop, 24 if quick else 120)
        cooling = _cooling(
            loop, 8 if quick else 40, nodes, ("joint", "first-fit") if quick else POLICIES
        )
        rounds = loop.bridge.metric("kelvin_slurm_bridge_reconcile_seconds_count")
        round_s = loop.bridge.metric("kelvin_slurm_bridge_reconcile_seconds_sum")
    finally:
        loop.close()
    return "\n".join(
        [
            f"A real Slurm 22.05 on loopback, {nodes} nodes (one slurmd each), slurmrestd with "
            "JWT; Kelvin's bridge talks to slurmrestd, the allocator follows the cluster.",
            "",
            "Submit-to-start latency on an idle cluster (one 2-node job at a time; ms):",
            "",
            "| placed by | jobs | p50 ms | p95 ms | max ms | p50 added by Kelvin ms |",
            "|---|---|---|---|---|---|",
            *latency,
            "",
            "Placements per second (a burst of 1-node jobs that exit at once; first submission "
            "to last start):",
            "",
            "| placed by | jobs | started | s | jobs/s |",
            "|---|---|---|---|---|",
            *throughput,
            "",
            f"Bridge rounds: {rounds:.0f}, mean {round_s / max(rounds, 1) * 1e3:.1f} ms each "
            "(read Slurm, sync the allocator, act).",
            "",
            "Cooling energy of the same job stream (seeded Poisson arrivals, mean gap 1.5 s, "
            "2-8 nodes, 3-8 s each) placed by each policy and by Slurm itself, on the simulated "
            "hall the pusher measures (Wh over the same window; relative to Slurm):",
            "",
            "| placed by | cooling Wh | IT Wh | cooling / IT | cooling vs Slurm | makespan s "
            "| mean wait s |",
            "|---|---|---|---|---|---|---|",
            *cooling,
        ]
    )


if __name__ == "__main__":
    print(main(quick=True))
