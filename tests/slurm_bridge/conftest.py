"""The closed loop on a real Slurm, shared by this package's tests (started once per session).

``slurm_cluster`` (tests/support/slurm.py: 12 nodes n01-n12 on loopback),
``kelvin up`` (collect agent, query API, allocator following Slurm, pusher
with the simulated hall of those 12 nodes) and one ``kelvin run
slurm-bridge`` process that a test may kill and start again.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from services.common.halls.hallfile import save_hall
from services.common.thermal import reference_hall
from tests.support.kelvin import KelvinUp
from tests.support.servers import free_port
from tests.support.slurm import Bridge, SlurmCluster, slurm_cluster

__all__ = ["slurm_cluster"]

HALL_NODES = 12
"""Row 0, racks 0-2 of the reference hall: hall index i is Slurm node n{i+1:02d}."""


def slurm_name(index: int) -> str:
    return f"n{index + 1:02d}"


class Stack:
    """Slurm + ``kelvin up`` + the bridge, and what the tests ask of them."""

    def __init__(self, cluster: SlurmCluster, up: KelvinUp, bridge: Bridge) -> None:
        self.cluster = cluster
        self.up = up
        self.bridge = bridge
        self.allocator = httpx.Client(base_url=up.url("allocator"), timeout=10)
        self.query = httpx.Client(base_url=up.url("query_api"), timeout=30)

    def allocator_job(self, job_id: str) -> dict[str, Any]:
        r = self.allocator.get(f"/api/v1/jobs/{job_id}")
        r.raise_for_status()
        doc: dict[str, Any] = r.json()
        return doc

    def kelvin_nodes(self, job_id: str) -> list[str]:
        """The Slurm names of the nodes the allocator has for a job."""
        return [slurm_name(i) for i in self.allocator_job(job_id)["nodes"]]

    def slurm_nodes(self, job: dict[str, Any]) -> list[str]:
        return self.cluster.hostnames(job["nodes"]) if job["nodes"] else []

    def wait_done(self, ids: list[str], timeout: float = 60.0) -> dict[str, dict[str, Any]]:
        def done() -> dict[str, dict[str, Any]] | None:
            jobs = self.cluster.jobs()
            ended = all(jobs[i]["job_state"] not in ("PENDING", "RUNNING", "CONFIGURING",
                                                     "COMPLETING") for i in ids)  # fmt: skip
            return jobs if ended else None

        jobs: dict[str, dict[str, Any]] = self.cluster.wait(done, timeout, f"jobs {ids} done", 0.2)
        return jobs

    def idle(self) -> None:
        """No job left and every node idle, in Slurm and in the allocator."""
        self.cluster.cancel_all()

        def allocator_idle() -> bool:
            doc = self.allocator.get("/api/v1/cluster").json()
            return not doc["running"] and not doc["placed"] and not doc["waiting"]

        self.cluster.wait(allocator_idle, 20, "allocator idle")


def _hall_file(workdir: Path) -> Path:
    present = np.zeros(40, dtype=bool)
    present[:HALL_NODES] = True
    hall = reference_hall().replace(present=present, name="slurm-test-12")
    return save_hall(hall, workdir / "hall.yaml")


@pytest.fixture(scope="session")
def stack(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("closed-loop")
    hall = str(_hall_file(work))
    up_conf = work / "kelvin.yaml"
    up_conf.write_text(
        yaml.safe_dump(
            {
                "allocator": {"cluster": "external", "hall_file": hall, "policy": "joint"},
                "pusher": {"plugins": {"datacenter": {"hall_file": hall, "seed": 1}}},
                "query_api": {"jobs": {"hall_file": hall}},
            }
        )
    )
    up = KelvinUp(work, config=up_conf).start()
    token = secrets.token_urlsafe(16)
    token_file = work / "notify.token"
    token_file.write_text(token + "\n")
    wake = free_port()
    bridge = Bridge(
        work,
        {
            "host": "127.0.0.1",
            "port": free_port(),
            "wake_port": wake,
            "allocator_url": up.url("allocator"),
            "slurmrestd_url": slurm_cluster.rest_url,
            "jwt_user": "root",
            "jwt_key_file": str(slurm_cluster.jwt_key),
            "node_names": f"n[01-{HALL_NODES:02d}]",
            "poll_interval_s": 1.0,
            "notify_token": token,
        },
        # the tokens `kelvin up` generated: the bridge calls the allocator as its admin
        auth={"token_file": str(work / "auth" / "tokens.json")},
    )
    slurm_cluster.notify_conf(bridge.url, token_file, wake)
    bridge.start()
    s = Stack(slurm_cluster, up, bridge)
    try:
        yield s
    finally:
        bridge.stop()
        up.stop()
        slurm_cluster.notify_conf(None)
